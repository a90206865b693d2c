"""Nova's server status: the (vm_state, task_state) → status map, both ways, and the
power state numbers.

``STATE_MAP`` is Nova's ``nova.api.openstack.common._STATE_MAP`` (same entries). A
status names a set of (vm_state, task_state) pairs: the explicit ones, and for a
vm_state's ``default`` every task_state (null included) that the vm_state's map does not
name. ``status_filter`` turns statuses into exactly that set, so every listed server
shows the status it was filtered by. (Nova's own ``task_and_vm_state_from_status``
filters by the cross product of the vm_states and the task_states it collects, and
drops the task filter when a ``default`` is involved, so ``status=ACTIVE`` also returns
servers shown as ``REBOOT``; Cellsight does not reproduce that imprecision.)
"""

from __future__ import annotations

from collections.abc import Iterable

from cellsight.query.tree import And, Compare, In, Node, Not, Op, Or, conjunction, disjunction

DEFAULT = "default"

_REBOOT = ("rebooting", "reboot_pending", "reboot_started")
_HARD_REBOOT = ("rebooting_hard", "reboot_pending_hard", "reboot_started_hard")
_REBUILD = ("rebuilding", "rebuild_block_device_mapping", "rebuild_spawning")
_RESIZE = ("resize_prep", "resize_migrating", "resize_migrated", "resize_finish")

STATE_MAP: dict[str, dict[str, str]] = {
    "active": {
        DEFAULT: "ACTIVE",
        **dict.fromkeys(_REBOOT, "REBOOT"),
        **dict.fromkeys(_HARD_REBOOT, "HARD_REBOOT"),
        "updating_password": "PASSWORD",
        **dict.fromkeys(_REBUILD, "REBUILD"),
        "migrating": "MIGRATING",
        **dict.fromkeys(_RESIZE, "RESIZE"),
    },
    "building": {DEFAULT: "BUILD"},
    "stopped": {
        DEFAULT: "SHUTOFF",
        **dict.fromkeys(_RESIZE, "RESIZE"),
        **dict.fromkeys(_REBUILD, "REBUILD"),
    },
    "resized": {DEFAULT: "VERIFY_RESIZE", "resize_reverting": "REVERT_RESIZE"},
    "paused": {DEFAULT: "PAUSED", "migrating": "MIGRATING"},
    "suspended": {DEFAULT: "SUSPENDED"},
    "rescued": {DEFAULT: "RESCUE"},
    "error": {DEFAULT: "ERROR", **dict.fromkeys(_REBUILD, "REBUILD")},
    "deleted": {DEFAULT: "DELETED"},
    "soft-delete": {DEFAULT: "SOFT_DELETED"},
    "shelved": {DEFAULT: "SHELVED"},
    "shelved_offloaded": {DEFAULT: "SHELVED_OFFLOADED"},
}

STATUSES = frozenset(s for m in STATE_MAP.values() for s in m.values())

# Nova's ``nova.compute.power_state`` numbers ↔ the payload's names
# (``nova.objects.fields.InstancePowerState``).
POWER_STATES: dict[int, str] = {
    0: "pending",
    1: "running",
    3: "paused",
    4: "shutdown",
    6: "crashed",
    7: "suspended",
}
POWER_STATE_NUMBERS = {name: number for number, name in POWER_STATES.items()}

# Statuses whose detail view carries ``progress`` (Nova's ``_progress_statuses``).
PROGRESS_STATUSES = frozenset(
    {"ACTIVE", "BUILD", "REBUILD", "RESIZE", "VERIFY_RESIZE", "MIGRATING"}
)


def status_from_state(vm_state: str | None, task_state: str | None) -> str:
    """As Nova's ``status_from_state``: ``UNKNOWN`` for a vm_state it does not know."""
    task_map = STATE_MAP.get(vm_state or "")
    if task_map is None:
        return "UNKNOWN"
    return task_map.get(task_state or DEFAULT, task_map[DEFAULT])


def power_state_number(name: str | None) -> int:
    """The API shows numbers; an unknown or missing name is NOSTATE (0), as in Nova."""
    return POWER_STATE_NUMBERS.get(name or "", 0)


def known_status(status: str) -> bool:
    return status.strip().upper() in STATUSES


def status_filter(statuses: Iterable[str]) -> Node:
    """The documents whose (state, task_state) show one of ``statuses`` (case-insensitive).

    Unknown names match nothing; the caller rejects them first.
    """
    wanted = {s.strip().upper() for s in statuses}
    branches: list[Node] = []
    for vm_state, task_map in STATE_MAP.items():
        explicit = sorted(t for t, status in task_map.items() if t != DEFAULT and status in wanted)
        if task_map[DEFAULT] in wanted:
            # The default covers every task_state the map does not name for another
            # status, null included (``Not(In)`` is true for a missing value).
            others = sorted(
                t for t, status in task_map.items() if t != DEFAULT and status not in wanted
            )
            task_part: Node = Not(In("task_state", tuple(others))) if others else conjunction()
            branches.append(conjunction(Compare("state", Op.EQ, vm_state), task_part))
        elif explicit:
            branches.append(
                conjunction(Compare("state", Op.EQ, vm_state), In("task_state", tuple(explicit)))
            )
    return disjunction(*branches)


# Nova's vm_state of a server deleted softly (deferred delete): not deleted yet, but
# Nova's ``instance_get_all_by_filters_sort`` counts it with the deleted ones.
SOFT_DELETED_STATE = "soft-delete"


def deleted_filter(deleted: bool, soft_deleted: bool | None = None) -> Node:
    """Nova's ``deleted`` filter with its ``soft_deleted`` modifier
    (``instance_get_all_by_filters_sort``).

    Soft-deleted servers go with the deleted ones unless ``soft_deleted`` says
    otherwise: a normal listing leaves them out, ``deleted=true`` lists them (so
    ``status=SOFT_DELETED`` alone lists nothing, as in Nova). A true ``soft_deleted``
    adds them to a normal listing; a false one (Nova: an empty value) leaves them out of
    ``deleted=true``. A negated comparison matches a null ``state`` on every path."""
    with_soft = deleted if soft_deleted is None else soft_deleted
    soft = Compare("state", Op.EQ, SOFT_DELETED_STATE)
    gone = Compare("deleted", Op.EQ, deleted)
    if deleted == with_soft:
        return Or((gone, soft)) if deleted else And((gone, Not(soft)))
    return gone
