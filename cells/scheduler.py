"""The scheduler step: pick a cell and hosts for a request, as Nova's ``Selection`` lists.

For each instance of a request the answer is ``[chosen, alternate, …]``, the
alternates in the chosen host's cell (a build that fails on its host is retried on an
alternate without asking the scheduler again, and never crosses cells). All instances
of one request go to one cell, so that the boot is a single cell transaction.

Capacity is what the compute node rows say, with Nova's allocation ratios; the claim
itself happens in the boot transaction, guarded by the same arithmetic (``claim``),
so two concurrent boots cannot both take the last slot. As in Nova's host manager, a cell
whose database cannot be read is skipped (``read_answering``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import sqlalchemy as sa

from cellsight.cells.database import connect, unavailable_why
from cellsight.cells.errors import CellUnavailable, DatabaseUnavailable, NoValidHost
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.node_locks import lock_nodes, node_ids
from cellsight.cells.reads import list_compute_nodes
from cellsight.cells.schema import compute_nodes, utcnow
from cellsight.notifications.limits import LONG_MAX
from cellsight.notifications.objects import SchedulerLimits, Selection

log = logging.getLogger(__name__)
T = TypeVar("T")

ALLOCATION_REQUEST_VERSION = "1.36"
# Nova's ``[DEFAULT]default_availability_zone``: the zone of a compute host in none.
DEFAULT_AVAILABILITY_ZONE = "nova"


def zone_of(node: Mapping[str, Any], default: str | None) -> str | None:
    """A node's availability zone, as Nova's ``get_host_availability_zone`` reads a
    host's: its own, or the default zone for a host in none. What the scheduler filters
    on, and what an instance placed on the node records, however it was placed."""
    return node.get("availability_zone") or default


def _capped(limit: float) -> int:
    return LONG_MAX if limit >= LONG_MAX else int(limit)


@dataclass(frozen=True)
class Resources:
    vcpus: int
    memory_mb: int
    disk_gb: int

    @classmethod
    def of_flavor(cls, flavor: Mapping[str, Any]) -> Resources:
        return cls(
            vcpus=int(flavor.get("vcpus") or 0),
            memory_mb=int(flavor.get("memory_mb") or 0),
            disk_gb=int(flavor.get("root_gb") or 0) + int(flavor.get("ephemeral_gb") or 0),
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.vcpus - other.vcpus, self.memory_mb - other.memory_mb, self.disk_gb - other.disk_gb
        )


@dataclass
class HostState:
    """A compute node as the scheduler sees it, with what this request already took."""

    cell: CellMapping
    node: dict[str, Any]
    taken: Resources = field(default_factory=lambda: Resources(0, 0, 0))

    @property
    def limits(self) -> Resources:
        n = self.node
        # Capped at what a Selection's SchedulerLimits carries (a signed 64-bit integer):
        # a large capacity times its ratio failed every boot the node was weighed first for.
        return Resources(
            _capped(n["vcpus"] * n["cpu_allocation_ratio"]),
            _capped(n["memory_mb"] * n["ram_allocation_ratio"]),
            _capped(n["local_gb"] * n["disk_allocation_ratio"]),
        )

    @property
    def free(self) -> Resources:
        n, limits = self.node, self.limits
        return Resources(
            limits.vcpus - n["vcpus_used"] - self.taken.vcpus,
            limits.memory_mb - n["memory_mb_used"] - self.taken.memory_mb,
            limits.disk_gb - n["local_gb_used"] - self.taken.disk_gb,
        )

    def fits(self, want: Resources) -> bool:
        free = self.free
        return (
            free.vcpus >= want.vcpus
            and free.memory_mb >= want.memory_mb
            and free.disk_gb >= want.disk_gb
        )

    def weight(self) -> tuple[int, int]:
        # Nova's default RAM weigher spreads by free memory. Fewer forthcoming
        # reservations break ties (room for reserved builds), then the name: stable.
        return (-self.free.memory_mb, self.node["forthcoming_reservations"])

    def selection(self, want: Resources, default_zone: str | None) -> Selection:
        """As Nova's ``Selection.from_host_state``: a node in no zone is in the default
        one (``None`` when that is unset)."""
        n, limits = self.node, self.limits
        return Selection.from_allocation(
            compute_node_uuid=n["uuid"],
            service_host=n["host"],
            nodename=n["hypervisor_hostname"],
            cell_uuid=self.cell.uuid,
            allocation=allocation_request(n["uuid"], want),
            allocation_request_version=ALLOCATION_REQUEST_VERSION,
            limits=SchedulerLimits(
                vcpu=limits.vcpus, memory_mb=limits.memory_mb, disk_gb=limits.disk_gb
            ),
            availability_zone=zone_of(n, default_zone),
        )


def allocation_request(node_uuid: str, want: Resources) -> dict[str, Any]:
    """Placement's allocation request at ``ALLOCATION_REQUEST_VERSION``: the allocations
    and, since 1.34, the ``mappings`` of request groups to providers (the unsuffixed
    group, ``""``, to the node), which Nova's ``fill_provider_mapping`` reads. Amounts of
    zero are left out: placement's allocation schema wants at least 1."""
    amounts = {"VCPU": want.vcpus, "MEMORY_MB": want.memory_mb, "DISK_GB": want.disk_gb}
    resources = {rc: amount for rc, amount in amounts.items() if amount > 0}
    return {
        "allocations": {node_uuid: {"resources": resources}},
        "mappings": {"": [node_uuid]},
    }


class Scheduler:
    def __init__(
        self,
        registry: CellRegistry,
        *,
        alternates: int = 2,
        default_availability_zone: str | None = DEFAULT_AVAILABILITY_ZONE,
    ) -> None:
        self.registry = registry
        self.alternates = alternates
        self.default_availability_zone = default_availability_zone

    def zone_of(self, node: Mapping[str, Any]) -> str | None:
        return zone_of(node, self.default_availability_zone)

    def host_states(self, cells: Iterable[CellMapping]) -> list[HostState]:
        """The enabled, online nodes of the cells that answer (``read_answering``)."""
        return [
            HostState(cell, n)
            for cell, nodes in read_answering(self.registry, cells, list_compute_nodes)
            for n in nodes
            if not (n["disabled"] or n["offline"])
        ]

    def select_destinations(
        self,
        flavor: Mapping[str, Any],
        *,
        count: int = 1,
        cell: str | None = None,
        availability_zone: str | None = None,
        exclude_hosts: Iterable[str] = (),
    ) -> list[list[Selection]]:
        """``count`` lists of ``[chosen, *alternates]``, all in one cell."""
        if count < 1:
            raise ValueError("count must be at least 1")
        want = Resources.of_flavor(flavor)
        cells = self.registry.placeable_cells(cell or None)
        if not cells:
            raise NoValidHost("no enabled cells are registered")
        excluded = set(exclude_hosts)
        hosts = [
            h
            for h in self.host_states(cells)
            if h.node["host"] not in excluded
            and (availability_zone is None or self.zone_of(h.node) == availability_zone)
        ]
        by_cell: dict[str, list[HostState]] = {}
        for host in sorted(hosts, key=lambda h: (h.weight(), h.node["host"])):
            by_cell.setdefault(host.cell.uuid, []).append(host)
        # The cell of the best host that can take the whole request.
        for cell_hosts in sorted(
            by_cell.values(), key=lambda hs: (hs[0].weight(), hs[0].node["host"])
        ):
            placed = self._place(cell_hosts, want, count)
            if placed is not None:
                return placed
        where = f" in availability zone {availability_zone!r}" if availability_zone else ""
        raise NoValidHost(
            f"no cell has room for {count} x {flavor.get('name')} "
            f"({want.vcpus} VCPU, {want.memory_mb} MB, {want.disk_gb} GB){where}"
        )

    def _place(
        self, hosts: list[HostState], want: Resources, count: int
    ) -> list[list[Selection]] | None:
        result: list[list[Selection]] = []
        for _ in range(count):
            fitting = sorted(
                (h for h in hosts if h.fits(want)), key=lambda h: (h.weight(), h.node["host"])
            )
            if not fitting:
                return None
            chosen = fitting[0]
            chosen.taken = Resources(
                chosen.taken.vcpus + want.vcpus,
                chosen.taken.memory_mb + want.memory_mb,
                chosen.taken.disk_gb + want.disk_gb,
            )
            zone = self.default_availability_zone
            result.append(
                [chosen.selection(want, zone)]
                + [h.selection(want, zone) for h in fitting[1 : 1 + self.alternates]]
            )
        return result


def read_answering(
    registry: CellRegistry, cells: Iterable[CellMapping], read: Callable[[sa.Connection], T]
) -> list[tuple[CellMapping, T]]:
    """``read`` on each cell that answers. As Nova's host manager, a cell that cannot be
    read is skipped (logged), so one outage does not stop placement in the others; when
    none answers, its outage is the answer."""
    out: list[tuple[CellMapping, T]] = []
    down: list[tuple[CellMapping, DatabaseUnavailable]] = []
    for cell in cells:
        try:
            with connect(registry.cell_engine(cell)) as conn:
                out.append((cell, read(conn)))
        except DatabaseUnavailable as exc:
            down.append((cell, exc))
        except sa.exc.DBAPIError as exc:
            # Reached, but its query failed (a database without the cell's tables): as
            # unreadable as one that does not answer (an adversarial probe got a 500).
            why = unavailable_why(cell.database_url, exc.orig if exc.orig is not None else exc)
            down.append((cell, DatabaseUnavailable(cell.database_url, why)))
    if down and not out:
        cell, failure = down[0]
        raise CellUnavailable(cell.name, failure)  # the one error line; nothing logged besides
    for cell, failure in down:
        log.warning("scheduler: skipping cell %s: %s", cell.name, failure)
    return out


def claim(conn: sa.Connection, node_uuid: str, want: Resources) -> bool:
    """Take ``want`` on a node inside the caller's transaction; False if it no longer fits.

    A negative ``want`` gives resources back (never below zero) and always succeeds.
    """
    c = compute_nodes.c
    ids = node_ids(conn, c.uuid == node_uuid)
    return bool(ids) and _claim_row(conn, ids[0], want)


def claim_first(
    conn: sa.Connection, choices: Sequence[Selection], want: Resources
) -> list[Selection] | None:
    """Claim ``want`` on the first of ``choices`` with room: the choices from that one on
    (it first, as Nova's first Selection is where the instance goes; the ones before it,
    full meanwhile, are no alternates), or None when none has room. A probe: racing
    reservations on h2 and h3 were each answered with h1 first."""
    for i, s in enumerate(choices):
        if claim(conn, s.compute_node_uuid, want):
            return list(choices[i:])
    return None


def claim_choices(
    conn: sa.Connection, requests: Sequence[tuple[str, Sequence[Selection]]], want: Resources
) -> list[list[Selection]]:
    """Each request's answer from the host claimed on (``claim_first``), every node of
    them locked first in id order (a claim that finds a node full still holds its row).
    ``requests``: (what an error names, its choices)."""
    lock_nodes(conn, (s.compute_node_uuid for _, choices in requests for s in choices))
    answers = []
    for name, choices in requests:
        answer = claim_first(conn, choices, want)
        if answer is None:
            raise NoValidHost(f"every host picked for {name} filled up meanwhile")
        answers.append(answer)
    return answers


def _claim_row(conn: sa.Connection, node_id: int, want: Resources) -> bool:
    c = compute_nodes.c
    guards: list[sa.ColumnElement[bool]] = [c.id == node_id, c.deleted.is_(False)]
    if want.vcpus > 0:
        guards.append(c.vcpus_used + want.vcpus <= c.vcpus * c.cpu_allocation_ratio)
    if want.memory_mb > 0:
        guards.append(c.memory_mb_used + want.memory_mb <= c.memory_mb * c.ram_allocation_ratio)
    if want.disk_gb > 0:
        guards.append(c.local_gb_used + want.disk_gb <= c.local_gb * c.disk_allocation_ratio)
    result = conn.execute(
        compute_nodes.update()
        .where(*guards)
        .values(
            vcpus_used=_not_below_zero(c.vcpus_used + want.vcpus),
            memory_mb_used=_not_below_zero(c.memory_mb_used + want.memory_mb),
            local_gb_used=_not_below_zero(c.local_gb_used + want.disk_gb),
            revision=c.revision + 1,
            updated_at=utcnow(),
        )
    )
    return result.rowcount == 1


def release(conn: sa.Connection, host: str | None, node: str | None, used: Resources) -> None:
    """Give back what an instance used on its node (looked up by host and node name)."""
    if host is None:
        return
    c = compute_nodes.c
    where = [c.host == host] + ([c.hypervisor_hostname == node] if node is not None else [])
    ids = node_ids(conn, *where)
    if ids:
        _claim_row(conn, ids[0], Resources(-used.vcpus, -used.memory_mb, -used.disk_gb))


def _not_below_zero(value: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    return sa.case((value < 0, 0), else_=value)
