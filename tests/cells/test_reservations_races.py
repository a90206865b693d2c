"""Reservations under races and outages, on every dialect: a boot that moves reservations
to make room never overwrites a cancel or commit that committed while it planned; one
unavailable cell does not stop placing, or making room, in the others. A Selection's
allocation request is placement's at the version it names; bad CLI values exit 2."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from cellsight.cells import room
from cellsight.cells.errors import DatabaseUnavailable, NoValidHost
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.nodeevents import register_node
from cellsight.cells.operations import Operations
from cellsight.cells.reservations import Reservations
from cellsight.cells.scheduler import Resources, allocation_request
from cellsight.cells.schema import compute_nodes, instances
from tests.cells.test_cells_cli import Invoke, cli
from tests.support.outages import lose
from tests.support.publishers import CollectingPublisher
from tests.support.services import DIALECTS, DatabaseFactory

__all__ = ["cli"]
UUID_TEXT = "0b3e7c4c-0000-4000-8000-0000000000c1"
NODE = {"vcpus": 4, "memory_mb": 16384, "local_gb": 200, "cpu_allocation_ratio": 1.0}


class Cell:
    def __init__(
        self,
        make_database: DatabaseFactory,
        dialect: str,
        tmp: Path,
        hosts: tuple[str, ...] = ("h1", "h2"),
        node: dict[str, Any] = NODE,
    ) -> None:
        self.registry = CellRegistry(make_database(dialect))
        self.registry.create_schema()
        self.cell = self.registry.add_cell("cell1", make_database(dialect))
        self.ops = Operations(self.registry, CollectingPublisher(), publisher_id="probe")
        for host in hosts:
            register_node(self.ops, "cell1", host, **node)
        self.reservations = Reservations(self.ops)

    def usage(self) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
        """(host → (vcpus used, reservations)) as the nodes say, and as the live rows add up."""
        with self.registry.cell_engine(self.cell).connect() as conn:
            nodes = conn.execute(sa.select(compute_nodes)).mappings().all()
            rows = conn.execute(sa.select(instances).where(instances.c.deleted.is_(False)))
            live = rows.mappings().all()
        said = {n["host"]: (n["vcpus_used"], n["forthcoming_reservations"]) for n in nodes}
        summed = {
            host: (
                sum(r["vcpus"] or 0 for r in live if r["host"] == host),
                sum(1 for r in live if r["host"] == host and r["forthcoming"]),
            )
            for host in said
        }
        return said, summed

    def host_of(self, uuid: str) -> str | None:
        with self.registry.cell_engine(self.cell).connect() as conn:
            query = sa.select(instances.c.host).where(instances.c.uuid == uuid)
            host: str | None = conn.execute(query).scalar_one()
        return host


@pytest.fixture(params=DIALECTS)
def cell(
    request: pytest.FixtureRequest, make_database: DatabaseFactory, tmp_path: Path
) -> Iterator[Cell]:
    made = Cell(make_database, request.param, tmp_path)
    yield made
    made.registry.close()


def _interleave(monkeypatch: pytest.MonkeyPatch, competitor: Callable[[], Any]) -> list[Any]:
    """Run ``competitor`` in another thread right after the room planner read the
    reservations (once), and let the planner go on when it finished (or after 2 s: on
    SQLite it waits for the planner's write lock)."""
    outcome: list[Any] = []
    real = room._plan
    fired = threading.Event()

    def run() -> None:
        try:
            outcome.append(competitor())
        except Exception as exc:
            outcome.append(exc)

    def plan_then_race(*args: Any, **kwargs: Any) -> Any:
        plan = real(*args, **kwargs)
        if plan and not fired.is_set():
            fired.set()
            racer = threading.Thread(target=run)
            racer.start()
            racer.join(2.0)
            outcome.append(racer)
        return plan

    monkeypatch.setattr(room, "_plan", plan_then_race)
    return outcome


@pytest.mark.services
@pytest.mark.parametrize("racing", ["cancel", "commit"])
def test_a_move_never_overwrites_a_cancel_or_commit_that_raced_it(
    cell: Cell, monkeypatch: pytest.MonkeyPatch, racing: str
) -> None:
    # Each host holds one 2-VCPU reservation: a 4-VCPU boot needs one of them moved.
    first = cell.reservations.reserve(
        flavor="m1.medium", host="h1", name="r", project_id="p", user_id="u"
    ).uuid
    cell.reservations.reserve(flavor="m1.medium", host="h2")
    other = Reservations(Operations(cell.registry, CollectingPublisher(), publisher_id="o"))
    outcome = _interleave(monkeypatch, lambda: getattr(other, racing)(first))
    booted = cell.ops.boot(BootRequest("big", "m1.large", "p", "u"))
    for thread in outcome:
        if isinstance(thread, threading.Thread):
            thread.join(10)
    assert len(booted.instances) == 1
    assert not [o for o in outcome if isinstance(o, Exception)], outcome
    said, summed = cell.usage()
    assert said == summed  # no claim held for a cancelled row, no count left behind
    if racing == "commit":
        # A built instance is never moved after its commit: it stays where the commit
        # put it (h1, or h2 when the move committed first, as on SQLite).
        (built,) = [o for o in outcome if not isinstance(o, threading.Thread)]
        assert cell.host_of(first) == built.host


@pytest.mark.services
def test_a_reservation_right_after_the_moves_cannot_take_the_boots_room(
    cell: Cell, monkeypatch: pytest.MonkeyPatch
) -> None:
    # h1 and h2 each hold a 2-VCPU reservation: a 4-VCPU boot needs one moved, after
    # which the cell is full. A client reserving 4 VCPUs the moment the moves are
    # published must not take the room they made (they commit with the boot, or not at
    # all): the boot lands and the later reservation is refused.
    cell.reservations.reserve(flavor="m1.medium", host="h1")
    cell.reservations.reserve(flavor="m1.medium", host="h2")
    other = Reservations(Operations(cell.registry, CollectingPublisher(), publisher_id="o"))
    raced: list[Any] = []
    deliver = cell.ops.deliver

    def deliver_then_race(mapping: CellMapping) -> None:
        deliver(mapping)
        if not raced:
            try:
                raced.append(other.reserve(flavor="m1.large"))
            except NoValidHost as refused:
                raced.append(refused)

    monkeypatch.setattr(cell.ops, "deliver", deliver_then_race)
    booted = cell.ops.boot(BootRequest("big", "m1.large", "p", "u"))
    assert len(booted.instances) == 1
    assert [type(r) for r in raced] == [NoValidHost]
    said, summed = cell.usage()
    assert said == summed
    assert said[booted.instances[0].host] == (4, 0)  # type: ignore[index]
    assert sorted(said.values()) == [(4, 0), (4, 2)]


@pytest.mark.services
@pytest.mark.services
def test_a_boot_of_several_makes_room_for_each(cell: Cell) -> None:
    for host in ("h3", "h4"):  # four hosts: two to empty, two to take what they held
        register_node(cell.ops, "cell1", host, **NODE)
    for host in ("h1", "h2", "h3", "h4"):
        cell.reservations.reserve(flavor="m1.medium", host=host)
    # Every host has 2 of 4 VCPUs free: two 4-VCPU instances need two hosts emptied,
    # their reservations moved onto the other two, which are then full.
    booted = cell.ops.boot(BootRequest("big", "m1.large", "p", "u", count=2))
    hosts = {i.host for i in booted.instances}
    assert len(booted.instances) == 2 and len(hosts) == 2
    assert [len(choices) for choices in booted.selections] == [1, 1]
    said, summed = cell.usage()
    assert said == summed
    assert sorted(said.values()) == [(4, 0), (4, 0), (4, 2), (4, 2)]
    assert all(said[h] == (4, 0) for h in hosts)  # type: ignore[index]


def test_a_boot_no_move_would_place_maps_nothing(
    two_cells: tuple[CellRegistry, list[CellMapping], Operations],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each cell is full of reservations with nowhere to go: refused, and no cell's
    # attempt wrote a mapping to the API database (it maps once a cell will take it).
    registry, cells, ops = two_cells
    for c in cells:
        register_node(ops, c.name, f"{c.name}-h1", **NODE)
        Reservations(ops).reserve(flavor="m1.medium", host=f"{c.name}-h1")
    placed: list[str] = []
    place = registry.place_instances

    def placing(cell: str, rows: Sequence[tuple[str, str, str | None]]) -> None:
        placed.append(cell)
        place(cell, rows)

    monkeypatch.setattr(registry, "place_instances", placing)
    with pytest.raises(NoValidHost, match="no cell has room"):
        ops.boot(BootRequest("big", "m1.large", "p", "u"))
    assert placed == []


def test_a_boot_makes_room_when_the_api_database_is_the_cells_sqlite_file(
    tmp_path: Path,
) -> None:
    # add_cell accepts one SQLite file for both; the mapping is written outside the cell's
    # write transaction, or the boot would wait on its own lock (a review found it).
    url = f"sqlite:///{tmp_path / 'one.db'}"
    registry = CellRegistry(url)
    registry.create_schema()
    try:
        registry.add_cell("cell1", url)
        ops = Operations(registry, CollectingPublisher(), publisher_id="probe")
        for host in ("h1", "h2"):
            register_node(ops, "cell1", host, **NODE)
            Reservations(ops).reserve(flavor="m1.medium", host=host)
        started = time.monotonic()
        booted = ops.boot(BootRequest("big", "m1.large", "p", "u"))
        assert len(booted.instances) == 1
        assert time.monotonic() - started < 5.0  # no wait on a lock it holds itself
    finally:
        registry.close()


@pytest.mark.parametrize("then", ["full", "changing"])
def test_a_refusal_after_plans_were_overtaken_says_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    # Each plan read without locks finds room and the same plan under locks does not
    # (another change took it); then the cell is full ("no room"), or keeps changing.
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}")
    registry.create_schema()
    try:
        registry.add_cell("cell1", f"sqlite:///{tmp_path / 'cell1.db'}")
        ops = Operations(registry, CollectingPublisher(), publisher_id="probe")
        for host in ("h1", "h2"):
            register_node(ops, "cell1", host, **NODE)
            Reservations(ops).reserve(flavor="m1.medium", host=host)
        real, calls = room.plan_room, []

        def overtaken(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            if then == "full" and len(calls) > 2:
                return None  # the second read without locks: no room left
            return real(*args, **kwargs) if len(calls) % 2 else None

        monkeypatch.setattr(room, "plan_room", overtaken)
        refused = "no cell has room" if then == "full" else "kept changing"
        with pytest.raises(NoValidHost, match=refused):
            ops.boot(BootRequest("big", "m1.large", "p", "u"))
        with registry.api_engine.connect() as conn:  # the two reservations' alone
            assert conn.execute(sa.text("SELECT count(*) FROM instance_mappings")).scalar() == 2
    finally:
        registry.close()


@pytest.fixture
def two_cells(tmp_path: Path) -> Iterator[tuple[CellRegistry, list[CellMapping], Operations]]:
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}")
    registry.create_schema()
    try:
        cells = [registry.add_cell(n, f"sqlite:///{tmp_path / n}.db") for n in ("c1", "c2")]
        yield registry, cells, Operations(registry, CollectingPublisher(), publisher_id="probe")
    finally:
        registry.close()


def test_an_unavailable_cell_is_skipped_by_the_scheduler(
    two_cells: tuple[CellRegistry, list[CellMapping], Operations],
) -> None:
    registry, cells, ops = two_cells
    for c in cells:
        register_node(ops, c.name, f"{c.name}-h1", **NODE)
    lose(registry, cells[0])
    made = Reservations(ops).reserve(flavor="m1.small")
    assert made.cell.uuid == cells[1].uuid
    forced = Reservations(ops).reserve(flavor="m1.small", host="c2-h1")
    assert forced.cell.uuid == cells[1].uuid
    # Only the named cell, and it is down: that outage, not "no valid host".
    with pytest.raises(DatabaseUnavailable):
        Reservations(ops).reserve(flavor="m1.small", cell="c1")


def test_an_unavailable_cell_does_not_stop_making_room_in_another(
    two_cells: tuple[CellRegistry, list[CellMapping], Operations],
) -> None:
    registry, cells, ops = two_cells
    for host in ("h1", "h2"):
        register_node(ops, "c2", f"c2-{host}", **NODE)
        Reservations(ops).reserve(flavor="m1.medium", host=f"c2-{host}")
    lose(registry, cells[0])
    booted = ops.boot(BootRequest("big", "m1.large", "p", "u"))
    assert booted.cell.uuid == cells[1].uuid


def test_a_selection_carries_placements_mappings_and_no_zero_amounts(tmp_path: Path) -> None:
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}")
    registry.create_schema()
    try:
        registry.add_cell("c1", f"sqlite:///{tmp_path / 'c1.db'}")
        ops = Operations(registry, CollectingPublisher(), publisher_id="probe")
        node = register_node(ops, "c1", "c1-h1", **NODE)
        (chosen,) = Reservations(ops).reserve(flavor="m1.small").selections
        assert chosen.allocation_request_version == "1.36"
        assert chosen.allocation_request is not None
        request = json.loads(chosen.allocation_request)
        # Nova's fill_provider_mapping reads ['mappings'] (placement 1.34 and later).
        assert request["mappings"] == {"": [node.uuid]}
        resources = request["allocations"][node.uuid]["resources"]
        assert resources == {"VCPU": 1, "MEMORY_MB": 2048, "DISK_GB": 20}
        # Placement refuses an amount of 0 in an allocation.
        assert allocation_request(node.uuid, Resources(1, 512, 0))["allocations"] == {
            node.uuid: {"resources": {"VCPU": 1, "MEMORY_MB": 512}}
        }
    finally:
        registry.close()


def test_bad_cli_values_are_usage_errors(cli: Invoke) -> None:
    assert cli("ops", "reserve", "--uuid", "garbage").exit_code == 2
    for option in ("--name", "--project", "--user"):
        assert cli("ops", "reserve", option, "x" * 256).exit_code == 2
        assert cli("ops", "modify", UUID_TEXT, option, "x" * 256).exit_code == 2


def test_a_taken_uuid_is_a_usage_error(cli: Invoke) -> None:
    """An adversarial probe: reserving a uuid already taken exited 1, where the exit
    codes' table (and a taken cell or host name) says 2."""
    assert cli("cells", "seed", "--cells", "1", "--instances", "0").exit_code == 0
    first = cli("ops", "reserve", "--uuid", UUID_TEXT, "--flavor", "m1.tiny")
    assert first.exit_code == 0, first.output
    again = cli("ops", "reserve", "--uuid", UUID_TEXT, "--flavor", "m1.tiny")
    assert again.exit_code == 2, again.output
    assert UUID_TEXT in again.stderr and "already exists" in again.stderr


def test_a_cell_without_its_tables_is_skipped_by_the_scheduler(
    two_cells: tuple[CellRegistry, list[CellMapping], Operations],
) -> None:
    """An adversarial probe emptied a cell's database (dropped and made again): its
    query failed past the connection, and every reservation, even one naming a host of
    another cell, answered 500. It is skipped now, as a cell that does not answer is."""
    import sqlalchemy as sa

    registry, cells, ops = two_cells
    for c in cells:
        register_node(ops, c.name, f"{c.name}-h1", **NODE)
    with registry.cell_engine(cells[0]).begin() as conn:
        conn.execute(sa.text("DROP TABLE compute_nodes"))
    forced = Reservations(ops).reserve(flavor="m1.small", host="c2-h1")
    assert forced.cell.uuid == cells[1].uuid
    assert Reservations(ops).reserve(flavor="m1.small").cell.uuid == cells[1].uuid
    with pytest.raises(DatabaseUnavailable, match="no such table"):
        Reservations(ops).reserve(flavor="m1.small", cell="c1")
