"""The wire contract of Cellsight's own objects (a Selection, a compute node): their round
trips and named errors, as the Nova objects' in ``test_contract.py``."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from cellsight.notifications.errors import (
    MalformedNotification,
)
from cellsight.notifications.objects import ComputeNodePayload, SchedulerLimits, Selection
from cellsight.notifications.registry import decode_payload


def _selection(allocation: dict[str, Any] | None) -> Selection:
    return Selection.from_allocation(
        compute_node_uuid="0f3b8a2e-6d5c-4c1a-9a7e-3b2f1d0c9e8a",
        service_host="compute-1",
        nodename="node-1",
        cell_uuid="5a1c2b3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
        allocation=allocation,
        allocation_request_version="1.36",
        limits=SchedulerLimits(vcpu=16, memory_mb=None, disk_gb=100),
    )


def test_selection_legacy_dict_and_allocation_string() -> None:
    allocation = {"allocations": {"rp-1": {"resources": {"VCPU": 2, "MEMORY_MB": 2048}}}}
    selection = _selection(allocation)
    assert isinstance(selection.allocation_request, str)
    assert json.loads(selection.allocation_request) == allocation
    assert selection.to_dict() == {
        "host": "compute-1",
        "nodename": "node-1",
        "limits": {"vcpu": 16, "disk_gb": 100},
    }
    assert _selection(None).allocation_request is None

    wire = selection.to_primitive()
    assert wire["nova_object.name"] == "Selection"
    assert wire["nova_object.version"] == "1.1"
    # Nova's objects, as Nova's loader reads them: its namespace, every field present.
    assert wire["nova_object.namespace"] == "nova"
    assert isinstance(wire["nova_object.data"]["allocation_request"], str)
    limits = wire["nova_object.data"]["limits"]
    assert (limits["nova_object.name"], limits["nova_object.namespace"]) == (
        "SchedulerLimits",
        "nova",
    )
    assert limits["nova_object.data"] == {
        "numa_topology": None,
        "vcpu": 16,
        "disk_gb": 100,
        "memory_mb": None,
    }
    back = decode_payload(wire)
    # Fields compared, not models: a decoded object also remembers its wire name/version.
    assert isinstance(back, Selection) and back.model_dump() == selection.model_dump()
    assert back.to_primitive() == wire


def test_selection_without_limits() -> None:
    selection = Selection(
        compute_node_uuid="0f3b8a2e-6d5c-4c1a-9a7e-3b2f1d0c9e8a",
        service_host="h",
        nodename="n",
        cell_uuid="5a1c2b3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
    )
    assert selection.to_dict() == {"host": "h", "nodename": "n", "limits": {}}


def test_compute_node_round_trip() -> None:
    node = ComputeNodePayload(
        uuid="7d3c1a2b-0e9f-4d8c-b7a6-5e4f3d2c1b0a",
        host="compute-1",
        hypervisor_hostname="compute-1.example",
        cell_uuid="cell1",
        memory_mb=65536,
        memory_mb_used=2048,
        vcpus=32,
        vcpus_used=4,
        local_gb=500,
        local_gb_used=20,
        forthcoming_reservations=1,
        updated_at="2024-05-01T10:00:00.123456Z",
        revision=7,
    )
    wire = node.to_primitive()
    assert wire["nova_object.namespace"] == "cellsight"
    assert wire["nova_object.data"]["updated_at"] == "2024-05-01T10:00:00.123456Z"
    back = decode_payload(copy.deepcopy(wire))
    assert isinstance(back, ComputeNodePayload) and back.model_dump() == node.model_dump()
    assert back.to_primitive() == wire
    with pytest.raises(MalformedNotification, match="memory_mb"):
        decode_payload(wire | {"nova_object.data": wire["nova_object.data"] | {"memory_mb": -1}})


@pytest.mark.parametrize("field", ["updated_at", "created_at", "launched_at", "terminated_at"])
@pytest.mark.parametrize("value", [1500000000.0, 0, 1500000000, True])
def test_a_time_sent_as_a_number_is_malformed_as_nova_and_the_schema_say(
    field: str, value: object
) -> None:
    """An adversarial probe: pydantic read ``1500000000.0`` as Unix time and the indexer
    stored 2017-07-14, where Nova's DateTimeField and the exported schema take text."""
    from cellsight.indexer.planning import plan
    from tests.support import novagen

    body = novagen.notification("instance.update", seed=3)
    body["payload"]["nova_object.data"][field] = value
    (outcome,), planned = plan([novagen.body(body)])
    assert not planned and outcome is not None, "a number was taken for a time"
    assert outcome.reason_code == "malformed"
    assert f"field {field}: Input should be a time in ISO 8601 text" in (outcome.reason or "")
