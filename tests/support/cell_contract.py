"""Helpers of the cell contract suite (``tests/cells/test_cells_contract.py``,
``test_cells_operations.py``, ``test_cells_refusals.py``): a payload with every stored
field set, a boot with defaults, and a cell's row and node usage as stored."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from cellsight.cells.database import connect
from cellsight.cells.flavors import get_flavor
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.operations import Operations
from cellsight.cells.reads import get_instance, list_compute_nodes
from cellsight.notifications.payloads import (
    BlockDevicePayload,
    FlavorPayload,
    InstanceCreatePayload,
    IpPayload,
    KeypairPayload,
    SharePayload,
)

NOW = datetime(2026, 3, 14, 15, 9, 26, 535897, tzinfo=UTC)


def full_payload(uuid: str = "178b0921-8f85-4257-88b6-2e743b5a975c") -> InstanceCreatePayload:
    """Every stored field set, nested objects, unicode and microsecond times included."""
    return InstanceCreatePayload(
        uuid=uuid,
        user_id="fake",
        tenant_id="6f70656e737461636b20342065766572",
        reservation_id="r-npxv0e40",
        display_name="Zürich-Ω サーバー",
        display_description="a long\ndescription",
        host_name="zurich",
        host="host1",
        node="host1",
        os_type="linux",
        architecture="x86_64",
        availability_zone="az1",
        flavor=FlavorPayload.model_validate(get_flavor("c1.large")),
        image_uuid="155d900f-4e14-4e4c-a73d-069cbf4541e6",
        key_name="my-key",
        kernel_id="",
        ramdisk_id="",
        created_at=NOW - timedelta(days=3, microseconds=1),
        launched_at=NOW - timedelta(days=3),
        updated_at=NOW,
        terminated_at=None,
        deleted_at=None,
        state="active",
        power_state="running",
        task_state=None,
        progress=0,
        ip_addresses=[
            IpPayload(
                label="private",
                mac="fa:16:3e:4c:2c:30",
                meta={"k": "v"},
                port_uuid="ce531f90-199f-48c0-816c-13e38010b442",
                version=4,
                address="192.168.1.3",
                device_name="tapce531f90-19",
            ),
            IpPayload(label="public", version=6, address="2001:db8::1"),
        ],
        block_devices=[
            BlockDevicePayload(
                device_name="/dev/vda", boot_index=0, delete_on_termination=True, volume_id="vol-1"
            )
        ],
        metadata={"env": "prod", "ключ": "значение"},
        auto_disk_config="MANUAL",
        locked=True,
        locked_reason="maintenance",
        request_id="req-5b6c791d",
        action_initiator_project="p",
        action_initiator_user="u",
        shares=[SharePayload(share_id="s1", status="active")],
        keypairs=[
            KeypairPayload(
                user_id="fake",
                name="my-key",
                type="ssh",
                public_key="ssh-ed25519 AAAA",
                fingerprint="1e:2c",
            )
        ],
        tags=["prod", "web"],
        trusted_image_certificates=["cert-1"],
        instance_name="instance-00000001",
        revision=7,
        forthcoming=True,
        cell_uuid="50b19ee9-775f-4868-b517-76bf166a9486",
    )


def boot(ops: Operations, **fields: Any) -> InstanceCreatePayload:
    request = BootRequest(
        **{
            "display_name": "web",
            "flavor": "m1.small",
            "project_id": "p1",
            "user_id": "u1",
            **fields,
        }
    )
    return ops.boot(request).instances[0]


def row_of(registry: CellRegistry, cell: CellMapping, uuid: str) -> dict[str, Any] | None:
    with connect(registry.cell_engine(cell)) as conn:
        return get_instance(conn, uuid)


def node_usage(registry: CellRegistry, cell: CellMapping) -> dict[str, tuple[int, int, int]]:
    with connect(registry.cell_engine(cell)) as conn:
        return {
            n["host"]: (n["vcpus_used"], n["memory_mb_used"], n["local_gb_used"])
            for n in list_compute_nodes(conn)
        }
