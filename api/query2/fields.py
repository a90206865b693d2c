"""The query2 field registry: Ganeti-style definitions derived from the document fields.

Every field of ``cellsight.indexer.fields`` (itself generated from the payload objects) becomes a
query2 field, except the indexer's own bookkeeping (``version``, ``event_type``,
``indexed_at``, ``tags_version``): those exist only in the index, and both paths must answer alike.
Only the instance's ``display_name`` is renamed, to ``name``, the name Ganeti's
clients (and the direct-lookup filters) use; everything else keeps its document name,
so one name means the same thing in a query2 filter, the index and the payload.

One computed field: the instance ``status`` Nova's API shows (``cellsight.api.status``), which a
filter matches through the (vm_state, task_state) pairs that show it.

Kinds follow Ganeti: sizes (``*_mb``, ``*_gb``, the flavor's swap) are ``unit`` and keep
the unit their name says (the doc says it again); lists and nested objects are ``other``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from cellsight.indexer.fields import FIELDS_BY_RESOURCE, DocField, Kind

RESOURCES = ("instance", "node")


class QKind(StrEnum):
    UNKNOWN = "unknown"
    TEXT = "text"
    BOOL = "bool"
    NUMBER = "number"
    UNIT = "unit"
    TIMESTAMP = "timestamp"
    OTHER = "other"


@dataclass(frozen=True)
class FieldDef:
    name: str
    title: str
    kind: QKind
    doc: str
    doc_field: str  # the document (and filter tree) field behind it
    doc_kind: Kind
    many: bool = False
    computed: bool = False  # derived from other fields when rendered, not stored

    @property
    def filterable(self) -> bool:
        # Objects are stored whole and never searched (``enabled: false`` in the mapping).
        return self.doc_kind is not Kind.OBJECT

    @property
    def integral(self) -> bool:
        return self.doc_kind is Kind.LONG

    def definition(self) -> dict[str, str]:
        return {"name": self.name, "title": self.title, "kind": self.kind.value, "doc": self.doc}


# Present in every index document but not instance state: see the module docstring.
HIDDEN = frozenset({"version", "event_type", "indexed_at", "tags_version"})
RENAMES: dict[str, dict[str, str]] = {"instance": {"display_name": "name"}, "node": {}}
TITLES: dict[str, dict[str, str]] = {
    "instance": {"name": "Instance", "flavor_flavorid": "FlavorID"},
    "node": {},
}
_SIZE = re.compile(r"(^|_)(mb|gb)(_|$)")
SIZE_EXTRA = frozenset({"flavor_swap"})  # Nova flavors hold swap in MiB
_ACRONYMS = {
    "uuid": "UUID",
    "id": "ID",
    "ip": "IP",
    "mb": "MB",
    "gb": "GB",
    "os": "OS",
    "ip4": "IPv4",
    "ip6": "IPv6",
    "vcpus": "VCPUs",
    "vcpu": "VCPU",
    "rxtx": "RxTx",
    "flavorid": "FlavorID",
}

DOCS: dict[str, dict[str, str]] = {
    "instance": {
        "uuid": "Instance UUID",
        "user_id": "ID of the user who created the instance",
        "tenant_id": "ID of the project owning the instance",
        "reservation_id": "ID of the boot request that created the instance",
        "name": "Display name of the instance",
        "display_description": "Description of the instance",
        "host_name": "Host name of the instance, a DNS label",
        "host": "Compute service host running the instance",
        "node": "Hypervisor node running the instance",
        "os_type": "Operating system type of the image",
        "architecture": "CPU architecture of the image",
        "availability_zone": "Availability zone of the instance",
        "image_uuid": "UUID of the image the instance booted from",
        "key_name": "Name of the key pair injected at boot",
        "kernel_id": "ID of the kernel image",
        "ramdisk_id": "ID of the ramdisk image",
        "created_at": "Creation time",
        "launched_at": "Time the instance was last launched",
        "terminated_at": "Time the instance was terminated",
        "deleted_at": "Deletion time",
        "updated_at": "Time of the last change",
        "state": "VM state such as active, stopped or deleted",
        "power_state": "Power state as the hypervisor reports it",
        "task_state": "Task in progress on the instance",
        "progress": "Progress of the current task in percent",
        "ip_addresses": "Network addresses with their ports and labels",
        "block_devices": "Attached block devices",
        "metadata": "User metadata as key/value pairs",
        "auto_disk_config": "Disk partitioning mode, AUTO or MANUAL",
        "locked": "Whether the instance is locked against changes",
        "locked_reason": "Reason given when the instance was locked",
        "shares": "Attached file shares",
        "flavor_flavorid": "ID of the flavor",
        "flavor_memory_mb": "Memory of the flavor in MiB",
        "flavor_vcpus": "Virtual CPUs of the flavor",
        "flavor_root_gb": "Root disk size of the flavor in GiB",
        "flavor_ephemeral_gb": "Ephemeral disk size of the flavor in GiB",
        "flavor_name": "Name of the flavor",
        "flavor_swap": "Swap size of the flavor in MiB",
        "flavor_rxtx_factor": "Network bandwidth factor of the flavor",
        "flavor_vcpu_weight": "CPU weight of the flavor",
        "flavor_extra_specs": "Extra specifications of the flavor",
        "cell_uuid": "UUID of the cell holding the instance",
        "forthcoming": "Whether the instance is reserved but not built yet",
        "deleted": "Whether the instance is deleted",
        "tags": "Tags of the instance",
        "ip4": "IPv4 addresses of the instance",
        "ip6": "IPv6 addresses of the instance",
    },
    "node": {
        "uuid": "Compute node UUID",
        "host": "Compute service host of the node",
        "hypervisor_hostname": "Host name of the hypervisor",
        "cell_uuid": "UUID of the cell holding the node",
        "memory_mb": "Total memory in MiB",
        "memory_mb_used": "Memory in use in MiB",
        "vcpus": "Total virtual CPUs",
        "vcpus_used": "Virtual CPUs in use",
        "local_gb": "Total local disk in GiB",
        "local_gb_used": "Local disk in use in GiB",
        "forthcoming_reservations": "Forthcoming instances holding resources on the node",
        "disabled": "Whether the node takes no new instances",
        "offline": "Whether the node is offline",
        "updated_at": "Time of the last change",
    },
}


def _kind(field: DocField) -> QKind:
    if field.many or field.kind is Kind.OBJECT:
        return QKind.OTHER
    if field.kind is Kind.BOOLEAN:
        return QKind.BOOL
    if field.kind is Kind.DATE:
        return QKind.TIMESTAMP
    if field.kind in (Kind.LONG, Kind.DOUBLE):
        is_size = _SIZE.search(field.name) is not None or field.name in SIZE_EXTRA
        return QKind.UNIT if is_size else QKind.NUMBER
    return QKind.TEXT  # keyword, text, ip


def _title(name: str) -> str:
    return "".join(_ACRONYMS.get(part, part.capitalize()) for part in re.split(r"[_./]", name))


def _doc(resource: str, name: str) -> str:
    # A field added to the payloads later still gets a valid (if plain) doc.
    return DOCS[resource].get(name) or name.replace("_", " ").capitalize()


def _build(resource: str) -> dict[str, FieldDef]:
    out: dict[str, FieldDef] = {}
    for field in FIELDS_BY_RESOURCE[resource]:
        if field.name in HIDDEN:
            continue
        name = RENAMES[resource].get(field.name, field.name)
        out[name] = FieldDef(
            name=name,
            title=TITLES[resource].get(name) or _title(name),
            kind=_kind(field),
            doc=_doc(resource, name),
            doc_field=field.name,
            doc_kind=field.kind,
            many=field.many,
        )
    return out


COMPUTED: dict[str, list[FieldDef]] = {
    "instance": [
        FieldDef(
            name="status",
            title="Status",
            kind=QKind.TEXT,
            doc="Status as the Nova API shows it, such as ACTIVE or SHUTOFF",
            doc_field="status",
            doc_kind=Kind.KEYWORD,
            computed=True,
        )
    ],
    # Not in the node documents: added to each one when a snapshot is loaded, from
    # either source (``cellsight.api.query2.nodes.with_derived``), so filters evaluate
    # them like any other field. Not computed at render time: ``computed`` stays False.
    "node": [
        FieldDef(name, title, kind, doc, doc_field=name, doc_kind=doc_kind)
        for name, title, kind, doc_kind, doc in (
            ("name", "Node", QKind.TEXT, Kind.KEYWORD, "Node name: the hypervisor host name"),
            ("cell", "Cell", QKind.TEXT, Kind.KEYWORD, "Name of the cell holding the node"),
            (
                "memory_mb_free",
                "MemoryMBFree",
                QKind.UNIT,
                Kind.LONG,
                "Memory not in use in MiB, total minus used",
            ),
        )
    ],
}

REGISTRY: dict[str, dict[str, FieldDef]] = {
    r: {**_build(r), **{f.name: f for f in COMPUTED[r]}} for r in RESOURCES
}


def unknown_definition(name: str) -> dict[str, str]:
    """What Ganeti answers for a name it does not know: kind ``unknown``."""
    return {"name": name, "title": name, "kind": QKind.UNKNOWN.value, "doc": "Unknown field"}


def definitions(resource: str, names: list[str] | None = None) -> list[dict[str, str]]:
    """Definitions of ``names`` in order (unknown ones as ``unknown``), or of every field."""
    fields = REGISTRY[resource]
    if names is None:
        return [f.definition() for f in fields.values()]
    return [fields[n].definition() if n in fields else unknown_definition(n) for n in names]
