"""Nova's sort parameters → the total order (``sort_key``/``sort_dir``, repeatable)."""

from __future__ import annotations

from cellsight.api.auth import Principal
from cellsight.api.errors import Forbidden, invalid_parameter
from cellsight.api.microversion import Version
from cellsight.query.tree import Direction, SortKey, total_order

# Nova's valid sort keys → document fields; None for valid keys whose data Cellsight
# does not hold (access IPs, config drive, …): accepted, sorted as if all were equal.
SORT_KEYS: dict[str, str | None] = {
    "auto_disk_config": "auto_disk_config",
    "availability_zone": "availability_zone",
    "created_at": "created_at",
    "display_description": "display_description",
    "display_name": "display_name",
    "host": "host",
    "hostname": "host_name",
    "image_ref": "image_uuid",
    "kernel_id": "kernel_id",
    "key_name": "key_name",
    "launched_at": "launched_at",
    "locked": "locked",
    "node": "node",
    "power_state": "power_state",
    "progress": "progress",
    "project_id": "tenant_id",
    "ramdisk_id": "ramdisk_id",
    "task_state": "task_state",
    "terminated_at": "terminated_at",
    "updated_at": "updated_at",
    "user_id": "user_id",
    "uuid": "uuid",
    "vm_state": "state",
    **dict.fromkeys(
        (
            "access_ip_v4",
            "access_ip_v6",
            "config_drive",
            "instance_type_id",
            "launch_index",
            "locked_by",
            "root_device_name",
        )
    ),
}
# Nova's ``SERVER_LIST_IGNORE_SORT_KEY``: valid before its schema validation, now
# dropped with their sort_dir (``remove_invalid_sort_keys``); ``locked`` sorts from 2.73,
# and from 2.75 the rest are not in the schema's enum (a 400).
# Nova's listing order when no key is given: newest first (then uuid, the tie-breaker).
DEFAULT_ORDER = total_order((SortKey("created_at", Direction.DESC),))

IGNORED_SORT_KEYS = frozenset(
    (
        "architecture",
        "cell_name",
        "cleaned",
        "default_ephemeral_device",
        "default_swap_device",
        "deleted",
        "deleted_at",
        "disable_terminate",
        "ephemeral_gb",
        "ephemeral_key_uuid",
        "id",
        "key_data",
        "launched_on",
        "memory_mb",
        "os_type",
        "reservation_id",
        "root_gb",
        "shutdown_terminate",
        "user_data",
        "vcpus",
        "vm_mode",
        "locked",
    )
)
ADMIN_SORT_KEYS = frozenset({"host", "node"})


def parse_order(
    keys: list[str], dirs: list[str], principal: Principal, version: Version
) -> tuple[SortKey, ...]:
    """Nova's ``get_sort_params``, ``remove_invalid_sort_keys``, ``process_sort_params``
    and its instance lists' default order, then ``uuid`` ascending."""
    # Keys as given (Nova's schema compares them with its enum before they are stripped),
    # directions stripped (its ``get_sort_params``).
    dirs = [value.strip() for value in dirs] or ["desc"]
    ignored = IGNORED_SORT_KEYS - {"locked"} if version.at_least("2.73") else IGNORED_SORT_KEYS
    valid = SORT_KEYS.keys() - ignored if version.at_least("2.75") else SORT_KEYS.keys() | ignored
    for key in keys:
        if key not in valid:
            raise invalid_parameter(
                "sort_key", key, f"sort_key must be one of: {', '.join(sorted(valid))}."
            )
    keys = list(keys) or ["created_at"]
    for key in list(keys):
        if key in ignored:
            # Dropped with the sort_dir at its place, which shifts the ones after it.
            at = keys.index(key)
            if len(dirs) > at:
                dirs.pop(at)
            keys.pop(at)
        elif key in ADMIN_SORT_KEYS and not principal.is_admin:
            raise Forbidden(f"Only administrators can sort servers by {key}")
    # What is left, checked as Nova's listing checks it (``process_sort_params``): every
    # direction, then no more directions than keys, ignored ones gone (a 400 either way).
    for value in dirs:
        if value not in ("asc", "desc"):
            raise invalid_parameter("sort_dir", value, "sort_dir must be 'asc' or 'desc'.")
    if len(dirs) > len(keys):
        raise invalid_parameter(
            "sort_dir", ",".join(dirs), "Sort direction size exceeds sort key size."
        )
    if not keys:
        # Every key was ignored, and its direction with it: Nova's default order.
        return DEFAULT_ORDER
    default_dir = dirs[0] if dirs else "desc"
    order: list[SortKey] = []
    for i, key in enumerate(keys):
        field = SORT_KEYS[key]
        direction = Direction(dirs[i] if i < len(dirs) else default_dir)
        if field is not None and all(k.field != field for k in order):
            order.append(SortKey(field, direction))
    if not order:
        order = [SortKey("created_at", Direction(default_dir))]
    return total_order(tuple(order))
