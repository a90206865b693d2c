"""Instance documents → Nova's server bodies. The one renderer both paths use.

Everything comes from the document (the index path makes no database call), so the
index and the fan-out path give the same body for the same documents. Keys follow
Nova's view builder for the request's microversion; ``OS-EXT-SRV-ATTR:*`` only for
administrators (``hostname`` for everyone from 2.90, as in Nova). Values Cellsight does
not hold (access IPs, config drive, security groups, launch index, root device, user
data, trusted certificates, pinned zone, the instance's internal name) are rendered as
Nova renders an unset value (``""`` or ``null``) or, for security groups, left out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from api import status as st
from api.microversion import Version
from api.order import parse_date


@dataclass(frozen=True)
class LinkContext:
    """Where links point: ``base_url`` has no version (``http://host:port``);
    ``project`` is set when the request's path carried the project id (Nova keeps it)."""

    base_url: str
    project: str | None
    version: Version
    is_admin: bool

    def _join(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.base_url, *parts) if p)

    def self_link(self, collection: str, ident: str) -> str:
        return self._join("v2.1", self.project or "", collection, ident)

    def bookmark(self, collection: str, ident: str) -> str:
        return self._join(self.project or "", collection, ident)

    def links(self, ident: str) -> list[dict[str, str]]:
        return [
            {"rel": "self", "href": self.self_link("servers", ident)},
            {"rel": "bookmark", "href": self.bookmark("servers", ident)},
        ]

    def next_link(self, collection: str, params: Sequence[tuple[str, str]], marker: str) -> str:
        # Nova sorts the parameters and replaces the marker. Repeated parameters
        # (sort_key, sort_dir, status) are all kept, which Nova's own link drops, and
        # keep their relative order (a stable sort by name only): it is the sort order.
        kept = sorted(((k, v) for k, v in params if k != "marker"), key=lambda kv: kv[0])
        query = urlencode([*kept, ("marker", marker)])
        return f"{self._join('v2.1', self.project or '', collection)}?{query}"


def _canonical(value: str) -> bool:
    """Whether ``value`` is in the documents' own form (``…T12:00:00[.ffffff]Z``): the
    fast paths below slice it instead of parsing it (a page renders thousands)."""
    return len(value) in (20, 27) and value[-1] == "Z" and value[10] == "T" and value[19] in ".Z"


def isotime(value: str | datetime | None) -> str | None:
    """Nova's ``utils.isotime``: seconds precision, ``Z``."""
    if value is None:
        return None
    if isinstance(value, str) and _canonical(value):
        return value[:19] + "Z"
    return parse_date(value).strftime("%Y-%m-%dT%H:%M:%SZ")


def usage_time(value: str | datetime | None) -> str | None:
    """``OS-SRV-USG:*`` times: naive ISO with microseconds, as Nova serialises them."""
    if value is None:
        return None
    if isinstance(value, str) and _canonical(value):
        return value[:19] + "." + (value[20:26] if len(value) == 27 else "000000")
    return parse_date(value).strftime("%Y-%m-%dT%H:%M:%S.%f")


def host_id(project_id: str | None, host: str | None) -> str:
    """Nova's ``utils.generate_hostid``: sha224 of project id + host, "" without a host."""
    if not host:
        return ""
    return hashlib.sha224(((project_id or "") + host).encode("utf-8")).hexdigest()


def addresses(doc: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for ip in doc.get("ip_addresses") or []:
        if not ip.get("address"):
            continue
        meta = ip.get("meta") or {}
        version = ip.get("version") or (6 if ":" in ip["address"] else 4)
        out.setdefault(ip.get("label") or "", []).append(
            {
                "version": version,
                "addr": ip["address"],
                "OS-EXT-IPS:type": meta.get("type", "fixed"),
                "OS-EXT-IPS-MAC:mac_addr": ip.get("mac"),
            }
        )
    return out


def _flavor(doc: Mapping[str, Any], ctx: LinkContext) -> dict[str, Any]:
    if not ctx.version.at_least("2.47"):
        flavor_id = doc.get("flavor_flavorid") or ""
        return {
            "id": flavor_id,
            "links": [{"rel": "bookmark", "href": ctx.bookmark("flavors", flavor_id)}],
        }
    return {
        "vcpus": doc.get("flavor_vcpus"),
        "ram": doc.get("flavor_memory_mb"),
        "disk": doc.get("flavor_root_gb"),
        "ephemeral": doc.get("flavor_ephemeral_gb"),
        "swap": doc.get("flavor_swap") or 0,
        "original_name": doc.get("flavor_name"),
        "extra_specs": dict(doc.get("flavor_extra_specs") or {}),
    }


def _image(doc: Mapping[str, Any], ctx: LinkContext) -> dict[str, Any] | str:
    image_id = doc.get("image_uuid")
    if not image_id:
        return ""  # booted from volume
    return {
        "id": image_id,
        "links": [{"rel": "bookmark", "href": ctx.bookmark("images", image_id)}],
    }


def summary(doc: Mapping[str, Any], ctx: LinkContext) -> dict[str, Any]:
    """The index view."""
    return {"id": doc["uuid"], "links": ctx.links(doc["uuid"]), "name": doc.get("display_name")}


def detail(doc: Mapping[str, Any], ctx: LinkContext) -> dict[str, Any]:
    """The detail (and show) view."""
    v = ctx.version
    status = st.status_from_state(doc.get("state"), doc.get("task_state"))
    project = doc.get("tenant_id")
    server: dict[str, Any] = {
        "id": doc["uuid"],
        "name": doc.get("display_name"),
        "status": status,
        "tenant_id": project or "",
        "user_id": doc.get("user_id") or "",
        "metadata": dict(doc.get("metadata") or {}),
        "hostId": host_id(project, doc.get("host")),
        "image": _image(doc, ctx),
        "flavor": _flavor(doc, ctx),
        "created": isotime(doc.get("created_at")),
        # Nova shows "now" for a never-updated server; a fixed value keeps both paths
        # (and repeated pages) identical, so the creation time stands in.
        "updated": isotime(doc.get("updated_at") or doc.get("created_at")),
        "addresses": addresses(doc),
        "accessIPv4": "",
        "accessIPv6": "",
        "links": ctx.links(doc["uuid"]),
        "OS-DCF:diskConfig": "AUTO" if doc.get("auto_disk_config") == "AUTO" else "MANUAL",
        "OS-EXT-AZ:availability_zone": doc.get("availability_zone") or "",
        "config_drive": "",
        "key_name": doc.get("key_name"),
        "OS-SRV-USG:launched_at": usage_time(doc.get("launched_at")),
        "OS-SRV-USG:terminated_at": usage_time(doc.get("terminated_at")),
        "OS-EXT-STS:task_state": doc.get("task_state"),
        "OS-EXT-STS:vm_state": doc.get("state"),
        "OS-EXT-STS:power_state": st.power_state_number(doc.get("power_state")),
        "os-extended-volumes:volumes_attached": _volumes(doc, v),
    }
    if status in st.PROGRESS_STATUSES:
        server["progress"] = doc.get("progress") or 0
    if ctx.is_admin:
        server["OS-EXT-SRV-ATTR:host"] = doc.get("host")
        server["OS-EXT-SRV-ATTR:hypervisor_hostname"] = doc.get("node")
        server["OS-EXT-SRV-ATTR:instance_name"] = None
        if v.at_least("2.3"):
            server["OS-EXT-SRV-ATTR:reservation_id"] = doc.get("reservation_id")
            server["OS-EXT-SRV-ATTR:launch_index"] = None
            server["OS-EXT-SRV-ATTR:kernel_id"] = doc.get("kernel_id") or ""
            server["OS-EXT-SRV-ATTR:ramdisk_id"] = doc.get("ramdisk_id") or ""
            server["OS-EXT-SRV-ATTR:root_device_name"] = None
            server["OS-EXT-SRV-ATTR:user_data"] = None
    if (ctx.is_admin and v.at_least("2.3")) or v.at_least("2.90"):
        server["OS-EXT-SRV-ATTR:hostname"] = doc.get("host_name")
    if v.at_least("2.9"):
        server["locked"] = bool(doc.get("locked"))
    if v.at_least("2.19"):
        server["description"] = doc.get("display_description")
    if v.at_least("2.26"):
        server["tags"] = list(doc.get("tags") or [])
    if v.at_least("2.63"):
        server["trusted_image_certificates"] = None
    if v.at_least("2.73"):
        server["locked_reason"] = doc.get("locked_reason")
    if v.at_least("2.96"):
        server["pinned_availability_zone"] = None
    return server


def _volumes(doc: Mapping[str, Any], v: Version) -> list[dict[str, Any]]:
    out = []
    for bdm in doc.get("block_devices") or []:
        if not bdm.get("volume_id"):
            continue
        volume: dict[str, Any] = {"id": bdm["volume_id"]}
        if v.at_least("2.3"):
            volume["delete_on_termination"] = bool(bdm.get("delete_on_termination"))
        out.append(volume)
    return out


@dataclass(frozen=True)
class Unreachable:
    """An instance of a cell that did not answer, from its instance mapping only."""

    uuid: str
    project_id: str
    created_at: datetime | None


def unknown(entry: Unreachable, ctx: LinkContext, *, detailed: bool) -> dict[str, Any]:
    """Nova's minimal construct for a server in a down cell (2.69+)."""
    if not detailed:
        return {"id": entry.uuid, "status": "UNKNOWN", "links": ctx.links(entry.uuid)}
    return {
        "id": entry.uuid,
        "status": "UNKNOWN",
        "tenant_id": entry.project_id,
        "created": isotime(entry.created_at),
        "links": ctx.links(entry.uuid),
    }
