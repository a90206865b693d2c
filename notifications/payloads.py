"""Nova's versioned notification payloads, field-compatible with Nova.

Field lists follow Nova's ``nova/notifications/objects``, declared in Nova's order
(``VersionedObject.wire_order`` gives the order of the keys on the wire). Every field except the
instance ``uuid`` has a default, so an older minor version fills defaults (the
compatibility rule). Instance payloads allow extra fields: a newer minor, or a payload
class this code has never seen, keeps its extra fields on ``model_extra``.

Cellsight's producer adds fields to the instance snapshot (``revision``,
``cell_uuid``, ``forthcoming``, and ``tags`` on every class). They are left out of the
wire form when unset, so Nova's own payloads round-trip unchanged.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ConfigDict, Field

from cellsight.notifications.base import Timestamp, UuidStr, VersionedObject
from cellsight.notifications.forms import IpStr, MacStr, TagList


def _omit_none(value: Any) -> bool:
    return value is None


class FlavorPayload(VersionedObject):
    OBJ_NAME = "FlavorPayload"
    OBJ_VERSION = "1.4"

    flavorid: str | None = None
    memory_mb: int | None = None
    vcpus: int | None = None
    root_gb: int | None = None
    ephemeral_gb: int | None = None
    name: str | None = None
    swap: int | None = None
    rxtx_factor: float | None = None
    vcpu_weight: int | None = None
    disabled: bool | None = None
    is_public: bool | None = None
    extra_specs: dict[str, str] | None = None
    projects: list[str] | None = None
    description: str | None = None


class IpPayload(VersionedObject):
    OBJ_NAME = "IpPayload"
    OBJ_VERSION = "1.0"

    label: str | None = None
    mac: MacStr | None = None
    meta: dict[str, str] = Field(default_factory=dict)
    port_uuid: str | None = None
    version: int | None = None
    address: IpStr | None = None  # its version is told by the address (forms.py)
    device_name: str | None = None


class KeypairPayload(VersionedObject):
    OBJ_NAME = "KeypairPayload"
    OBJ_VERSION = "1.0"

    user_id: str | None = None
    name: str | None = None
    fingerprint: str | None = None
    public_key: str | None = None
    type: str | None = None


class BlockDevicePayload(VersionedObject):
    OBJ_NAME = "BlockDevicePayload"
    OBJ_VERSION = "1.0"

    device_name: str | None = None
    boot_index: int | None = None
    delete_on_termination: bool = False
    volume_id: str | None = None
    tag: str | None = None


class SharePayload(VersionedObject):
    OBJ_NAME = "SharePayload"
    OBJ_VERSION = "1.0"

    share_mapping_uuid: str | None = None
    share_id: str | None = None
    status: str | None = None
    tag: str | None = None
    export_location: str | None = None


class ExceptionPayload(VersionedObject):
    OBJ_NAME = "ExceptionPayload"
    OBJ_VERSION = "1.1"

    module_name: str | None = None
    function_name: str | None = None
    exception: str | None = None
    exception_message: str | None = None
    traceback: str | None = None


class InstanceStateUpdatePayload(VersionedObject):
    OBJ_NAME = "InstanceStateUpdatePayload"
    OBJ_VERSION = "1.0"

    old_state: str | None = None
    state: str | None = None
    old_task_state: str | None = None
    new_task_state: str | None = None


class AuditPeriodPayload(VersionedObject):
    OBJ_NAME = "AuditPeriodPayload"
    OBJ_VERSION = "1.0"

    audit_period_beginning: Timestamp | None = None
    audit_period_ending: Timestamp | None = None


class InstancePayload(VersionedObject):
    """The whole instance snapshot, the base of every ``instance.*`` payload."""

    model_config = ConfigDict(extra="allow")

    OBJ_NAME = "InstancePayload"
    OBJ_VERSION = "1.9"

    # The fields every InstancePayload version has carried since 1.0. A payload
    # whose data carries most of them is an instance snapshot whatever its class
    # name (decode by shape, not by a whitelist of names).
    SHAPE_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {
            "uuid",
            "user_id",
            "tenant_id",
            "reservation_id",
            "display_name",
            "host_name",
            "host",
            "node",
            "os_type",
            "architecture",
            "availability_zone",
            "flavor",
            "image_uuid",
            "kernel_id",
            "ramdisk_id",
            "created_at",
            "launched_at",
            "terminated_at",
            "deleted_at",
            "state",
            "power_state",
            "task_state",
            "progress",
            "ip_addresses",
            "metadata",
        }
    )

    uuid: UuidStr
    user_id: str | None = None
    tenant_id: str | None = None
    reservation_id: str | None = None
    display_name: str | None = None
    display_description: str | None = None
    host_name: str | None = None
    host: str | None = None
    node: str | None = None
    os_type: str | None = None
    architecture: str | None = None
    availability_zone: str | None = None
    flavor: FlavorPayload | None = None
    image_uuid: str | None = None
    key_name: str | None = None
    kernel_id: str | None = None
    ramdisk_id: str | None = None
    created_at: Timestamp | None = None
    launched_at: Timestamp | None = None
    terminated_at: Timestamp | None = None
    deleted_at: Timestamp | None = None
    updated_at: Timestamp | None = None
    state: str | None = None
    power_state: str | None = None
    task_state: str | None = None
    progress: int | None = None
    ip_addresses: list[IpPayload] = Field(default_factory=list)
    block_devices: list[BlockDevicePayload] | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    locked: bool = False
    auto_disk_config: str | None = None
    request_id: str | None = None
    action_initiator_user: str | None = None
    action_initiator_project: str | None = None
    locked_reason: str | None = None
    shares: list[SharePayload] | None = None

    # Cellsight's producer extensions; absent from Nova's own payloads.
    revision: int | None = Field(default=None, ge=0, exclude_if=_omit_none)
    cell_uuid: str | None = Field(default=None, exclude_if=_omit_none)
    forthcoming: bool | None = Field(default=None, exclude_if=_omit_none)
    # Nova sends tags only on create/update payloads; Cellsight's producer sends them on
    # every payload so that an action event never makes the indexer forget them.
    tags: TagList | None = Field(default=None, exclude_if=_omit_none)

    @classmethod
    def accepts_name(cls, name: str) -> bool:
        # The registry has already decided by shape that this is an instance snapshot.
        return True

    @classmethod
    def has_shape(cls, data: dict[str, Any]) -> bool:
        return len(cls.SHAPE_FIELDS & data.keys()) * 2 > len(cls.SHAPE_FIELDS)

    @property
    def extra_fields(self) -> dict[str, Any]:
        """Fields of a newer minor or an unknown subclass, kept out of documents."""
        return dict(self.model_extra or {})


class InstanceActionPayload(InstancePayload):
    OBJ_NAME = "InstanceActionPayload"
    OBJ_VERSION = "1.9"
    WIRE_REDECLARED = ("fault", "request_id")  # its own fields as Nova lists them

    fault: ExceptionPayload | None = None


class InstanceCreatePayload(InstanceActionPayload):
    OBJ_NAME = "InstanceCreatePayload"
    OBJ_VERSION = "1.13"

    keypairs: list[KeypairPayload] = Field(default_factory=list)
    tags: TagList = Field(default_factory=list)
    trusted_image_certificates: list[str] | None = None
    instance_name: str | None = None


class InstanceUpdatePayload(InstancePayload):
    OBJ_NAME = "InstanceUpdatePayload"
    OBJ_VERSION = "2.1"

    state_update: InstanceStateUpdatePayload | None = None
    audit_period: AuditPeriodPayload | None = None
    old_display_name: str | None = None
    tags: TagList = Field(default_factory=list)


class GenericPayload(VersionedObject):
    """Any other object (``service.update``'s ``ServiceStatusPayload``, …).

    The indexer counts and acks these; the data is kept verbatim so it round-trips.
    """

    model_config = ConfigDict(extra="allow")

    @classmethod
    def accepts_name(cls, name: str) -> bool:
        return True

    @classmethod
    def accepts_namespace(cls, namespace: Any) -> bool:
        return True  # the registry reads only Nova's and Cellsight's namespaces


# Nova's other instance payload classes (``nova/notifications/objects/instance.py``):
# each adds to InstancePayload fields that no document uses, so the registry reads them
# by shape, as an InstancePayload, and the compiled decoder knows them by name.
# ``instance.exists`` (the hourly audit of every instance) is the largest stream of them.
NOVA_INSTANCE_SUBCLASSES: tuple[str, ...] = (
    "InstanceExistsPayload",
    "InstanceActionVolumePayload",
    "InstanceActionVolumeSwapPayload",
    "InstanceActionResizePrepPayload",
    "InstanceActionRescuePayload",
    "InstanceActionRebuildPayload",
    "InstanceActionSnapshotPayload",
)

NOVA_PAYLOADS: tuple[type[VersionedObject], ...] = (
    FlavorPayload,
    IpPayload,
    KeypairPayload,
    BlockDevicePayload,
    SharePayload,
    ExceptionPayload,
    InstanceStateUpdatePayload,
    AuditPeriodPayload,
    InstancePayload,
    InstanceActionPayload,
    InstanceCreatePayload,
    InstanceUpdatePayload,
)
