"""The embedded index's secondary indexes as the layout before 2026-11-24 declared them
(``sqlite_schema`` says why it changed): what ``Catalog.update_indexes`` migrates from,
for the tests and the benchmarks that build such an index."""

from __future__ import annotations

EARLIER_LAYOUT: dict[str, list[tuple[str, ...]]] = {
    "instance": [
        ("cell_uuid", "id", "version"),
        ("created_at", "id"),
        ("tenant_id", "created_at", "id"),
        ("updated_at", "id"),
        ("user_id",),
        ("host",),
        ("node",),
        ("state", "created_at", "id"),
        ("display_name",),
    ],
    "node": [("cell_uuid", "id", "version"), ("host",), ("hypervisor_hostname",), ("updated_at",)],
}
