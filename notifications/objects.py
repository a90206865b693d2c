"""Versioned objects beside the instance payloads, in Nova's envelope: Cellsight's own
``ComputeNodePayload`` (namespace ``cellsight``), and Nova's ``Selection`` and
``SchedulerLimits`` as Nova defines them (namespace ``nova``, every field on the wire),
so that Nova's object loader reads them."""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from cellsight.notifications.base import Timestamp, UuidStr, VersionedObject

# The object and event of Cellsight's node notifications (``cells.nodeevents`` emits
# them; the indexer and the API's node cache read them).
NODE_OBJECT = "compute_node"
NODE_UPDATE = f"{NODE_OBJECT}.update"


class ComputeNodePayload(VersionedObject):
    """A compute node's resources, as the node documents and the node state cache hold them."""

    OBJ_NAME = "ComputeNodePayload"
    OBJ_VERSION = "1.0"
    OBJ_NAMESPACE = "cellsight"

    uuid: UuidStr
    host: str
    hypervisor_hostname: str
    cell_uuid: str | None = None
    memory_mb: int = Field(0, ge=0)
    memory_mb_used: int = Field(0, ge=0)
    vcpus: int = Field(0, ge=0)
    vcpus_used: int = Field(0, ge=0)
    local_gb: int = Field(0, ge=0)
    local_gb_used: int = Field(0, ge=0)
    forthcoming_reservations: int = Field(0, ge=0)
    disabled: bool = False
    offline: bool = False
    updated_at: Timestamp | None = None
    # The node row's revision, which orders a node's updates (the document's version).
    # Required: a payload without one could only be versioned by its time, a scale no
    # revision reaches, and it would have outranked every later update of the node.
    revision: int = Field(ge=0)


class SchedulerLimits(VersionedObject):
    """Nova's ``SchedulerLimits`` 1.0. Nova builds it with every field set (None when
    unlimited) and reads every field in ``to_dict``: one absent from the wire would be
    an unset field there, which Nova cannot lazy-load."""

    OBJ_NAME = "SchedulerLimits"
    OBJ_VERSION = "1.0"

    # A NUMATopologyLimits object's primitive when there is one; the scheduler here sets
    # no NUMA limits.
    numa_topology: dict[str, Any] | None = None
    vcpu: int | None = None
    disk_gb: int | None = None
    memory_mb: int | None = None

    def to_dict(self) -> dict[str, int]:
        """Only the limits that are set, as Nova's legacy filter properties hold them."""
        return {
            name: value
            for name in type(self).model_fields
            if (value := getattr(self, name)) is not None
        }


class Selection(VersionedObject):
    """One destination the scheduler picked, Nova's ``Selection`` 1.1."""

    OBJ_NAME = "Selection"
    OBJ_VERSION = "1.1"

    compute_node_uuid: UuidStr
    service_host: str
    nodename: str
    cell_uuid: UuidStr
    limits: SchedulerLimits | None = None
    allocation_request: str | None = None
    allocation_request_version: str | None = None
    availability_zone: str | None = None

    @classmethod
    def from_allocation(
        cls,
        *,
        compute_node_uuid: str,
        service_host: str,
        nodename: str,
        cell_uuid: str,
        allocation: dict[str, Any] | None,
        allocation_request_version: str | None = None,
        limits: SchedulerLimits | None = None,
        availability_zone: str | None = None,
    ) -> Selection:
        # Nova stores the allocation request as a JSON string, not a nested object.
        return cls(
            compute_node_uuid=compute_node_uuid,
            service_host=service_host,
            nodename=nodename,
            cell_uuid=cell_uuid,
            limits=limits,
            allocation_request=None if allocation is None else json.dumps(allocation),
            allocation_request_version=allocation_request_version,
            availability_zone=availability_zone,
        )

    def to_dict(self) -> dict[str, Any]:
        """The legacy form the old filter-properties code expects."""
        return {
            "host": self.service_host,
            "nodename": self.nodename,
            "limits": self.limits.to_dict() if self.limits is not None else {},
        }


CELLSIGHT_OBJECTS: tuple[type[VersionedObject], ...] = (
    ComputeNodePayload,
    SchedulerLimits,
    Selection,
)
