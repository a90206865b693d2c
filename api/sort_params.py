"""Nova's sort parameters → the total order (``sort_key``/``sort_dir``, repeatable)."""

from __future__ import annotations

from cellsight.api.auth import Principal
from cellsight.api.errors import Forbidden, invalid_parameter
from cellsight.query.tree import Direction, SortKey, total_order

# Nova's valid sort keys → document fields. Keys Nova accepts but ignores (its
# ``SERVER_LIST_IGNORE_SORT_KEY``), and valid keys whose data Cellsight does not hold
# (access IPs, config drive, …), map to None: accepted and ignored.
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
        )
    ),
}
ADMIN_SORT_KEYS = frozenset({"host", "node"})


def parse_order(keys: list[str], dirs: list[str], principal: Principal) -> tuple[SortKey, ...]:
    """Nova's ``get_sort_params`` + ``process_sort_params``, then ``uuid`` ascending."""
    for key in keys:
        if key.strip() not in SORT_KEYS:
            raise invalid_parameter(
                "sort_key", key, f"sort_key must be one of: {', '.join(sorted(SORT_KEYS))}."
            )
        if key.strip() in ADMIN_SORT_KEYS and not principal.is_admin:
            raise Forbidden(f"Only administrators can sort servers by {key.strip()}")
    for value in dirs:
        if value.strip() not in ("asc", "desc"):
            raise invalid_parameter("sort_dir", value, "sort_dir must be 'asc' or 'desc'.")
    if len(dirs) > len(keys) and keys:
        raise invalid_parameter(
            "sort_dir", ",".join(dirs), "Sort direction size exceeds sort key size."
        )
    default_dir = dirs[0].strip() if dirs else "desc"
    order: list[SortKey] = []
    for i, key in enumerate(keys):
        field = SORT_KEYS[key.strip()]
        direction = Direction(dirs[i].strip() if i < len(dirs) else default_dir)
        if field is not None and all(k.field != field for k in order):
            order.append(SortKey(field, direction))
    if not order:
        order = [SortKey("created_at", Direction(default_dir))]
    return total_order(tuple(order))
