"""Instance documents → Nova's server bodies. The one renderer both paths use.

Everything comes from the document (the index path makes no database call), so the
index and the fan-out path give the same body for the same documents. Keys follow
Nova's view builder for the request's microversion; ``OS-EXT-SRV-ATTR:*`` only for
administrators (``hostname`` for everyone from 2.90, as in Nova). Values Cellsight does
not hold (access IPs, config drive, security groups, root device, user data, trusted
certificates, pinned zone) are rendered as Nova renders an unset value (``""`` or
``null``) or, for security groups, left out.

Values Nova always has are typed as Tempest's schemas require:

* ``OS-EXT-SRV-ATTR:instance_name``: Nova renders ``instance_name_template % id``
  (``instance-%08x`` of the cell-local row id). Neither the notifications' update
  payload nor the index document carries that id, so when the document holds no name
  Cellsight renders the instance's uuid: Nova's own ``Instance.name`` when its
  template cannot be filled.
* ``OS-EXT-SRV-ATTR:launch_index`` (2.3+): ``0``, the index of a single create; the
  notifications do not carry the index of a multi-create.
* ``name``: ``""`` when the data has none (Nova requires a name at create; Tempest a
  string); ``OS-EXT-SRV-ATTR:hostname`` the same, and a flavorless reservation's
  flavor (2.47+) ``0`` and ``""``.
* ``server_groups`` (show, 2.71+): ``[]``, Nova's value for an instance in no group;
  group membership is not in the notifications.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property, lru_cache
from typing import Any
from urllib.parse import urlencode

from cellsight.api import status as st
from cellsight.api.merge_order import parse_date
from cellsight.api.microversion import Version
from cellsight.api.options import known
from cellsight.notifications.forms import address_version


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

    # A page renders thousands of links: the prefixes are joined once per request.
    @cached_property
    def _server_self(self) -> str:
        return self._join("v2.1", self.project or "", "servers") + "/"

    @cached_property
    def _server_bookmark(self) -> str:
        return self._join(self.project or "", "servers") + "/"

    @cached_property
    def _flavor_bookmark(self) -> str:
        return self._join(self.project or "", "flavors") + "/"

    @cached_property
    def _image_bookmark(self) -> str:
        return self._join(self.project or "", "images") + "/"

    @cached_property
    def flags(self) -> ViewFlags:
        return view_flags(self.version, self.is_admin)

    def links(self, ident: str) -> list[dict[str, str]]:
        if not ident or "/" in ident:
            return [
                {"rel": "self", "href": self.self_link("servers", ident)},
                {"rel": "bookmark", "href": self.bookmark("servers", ident)},
            ]
        return [
            {"rel": "self", "href": self._server_self + ident},
            {"rel": "bookmark", "href": self._server_bookmark + ident},
        ]

    def next_link(self, collection: str, params: Sequence[tuple[str, str]], marker: str) -> str:
        # Nova's: the parameters its schema kept (it strips unknown ones below 2.75),
        # sorted by name, the marker replaced where it stands or added last. Repeated
        # parameters (sort_key, sort_dir, status) are all kept, which Nova's own link
        # drops, and keep their relative order (a stable sort by name only): it is the
        # sort order.
        kept = sorted(((k, v) for k, v in params if known(k, self.version)), key=lambda kv: kv[0])
        pairs = [(k, v) for k, v in kept if k != "marker"]
        at = next((i for i, (k, _) in enumerate(kept) if k == "marker"), len(pairs))
        pairs.insert(at, ("marker", marker))
        return f"{self._join('v2.1', self.project or '', collection)}?{urlencode(pairs)}"


@dataclass(frozen=True)
class ViewFlags:
    """What a microversion and role put in the detail view, decided once per request
    (comparing versions per server was half of the rendering time)."""

    admin: bool
    v2_3: bool
    v2_9: bool
    v2_19: bool
    v2_26: bool
    v2_47: bool
    v2_63: bool
    v2_73: bool
    v2_90: bool
    v2_96: bool


@lru_cache(maxsize=512)
def view_flags(version: Version, is_admin: bool) -> ViewFlags:
    def at(text: str) -> bool:
        return version.at_least(text)

    return ViewFlags(
        is_admin,
        at("2.3"),
        at("2.9"),
        at("2.19"),
        at("2.26"),
        at("2.47"),
        at("2.63"),
        at("2.73"),
        at("2.90"),
        at("2.96"),
    )


def _canonical(value: str) -> bool:
    """Whether ``value`` is in the documents' own form (``…T12:00:00[.ffffff]Z``): the
    fast paths below slice it instead of parsing it (a page renders thousands)."""
    return len(value) in (20, 27) and value[-1] == "Z" and value[10] == "T" and value[19] in ".Z"


# A row without a creation time (written by other means: Nova always sets it) is shown
# as created at the epoch. Nova's ``isotime(None)`` is the time of the request, which
# differs from page to page and path to path; Tempest's schemas want a time, not null.
NO_TIME = "1970-01-01T00:00:00Z"


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


_ADDRESS_KINDS = frozenset({"fixed", "floating"})


def addresses(doc: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for ip in doc.get("ip_addresses") or []:
        if not ip.get("address"):
            continue
        meta = ip.get("meta") or {}
        kind = meta.get("type")
        shown = {
            # Told by the address, as Nova's network model tells it: a payload's
            # stray ``version`` (99) is never shown.
            "version": address_version(ip["address"]),
            "addr": ip["address"],
            # Nova's two kinds; a notification's addresses are its fixed ones.
            "OS-EXT-IPS:type": kind if kind in _ADDRESS_KINDS else "fixed",
        }
        if ip.get("mac") is not None:
            # Nova's MAC is never null; a notification may leave it out (no MAC is
            # shown, where null would fail clients' schemas).
            shown["OS-EXT-IPS-MAC:mac_addr"] = ip["mac"]
        out.setdefault(ip.get("label") or "", []).append(shown)
    return out


def _flavor(doc: Mapping[str, Any], ctx: LinkContext) -> dict[str, Any]:
    if not ctx.flags.v2_47:
        flavor_id = doc.get("flavor_flavorid") or ""
        href = (
            ctx._flavor_bookmark + flavor_id
            if flavor_id and "/" not in flavor_id
            else ctx.bookmark("flavors", flavor_id)
        )
        return {"id": flavor_id, "links": [{"rel": "bookmark", "href": href}]}
    # A reservation made without a flavor has none: empty values, typed as Tempest wants.
    return {
        "vcpus": doc.get("flavor_vcpus") or 0,
        "ram": doc.get("flavor_memory_mb") or 0,
        "disk": doc.get("flavor_root_gb") or 0,
        "ephemeral": doc.get("flavor_ephemeral_gb") or 0,
        "swap": doc.get("flavor_swap") or 0,
        "original_name": doc.get("flavor_name") or "",
        "extra_specs": dict(doc.get("flavor_extra_specs") or {}),
    }


def _image(doc: Mapping[str, Any], ctx: LinkContext) -> dict[str, Any] | str:
    image_id = doc.get("image_uuid")
    if not image_id:
        return ""  # booted from volume
    href = (
        ctx._image_bookmark + image_id if "/" not in image_id else ctx.bookmark("images", image_id)
    )
    return {"id": image_id, "links": [{"rel": "bookmark", "href": href}]}


def summary(doc: Mapping[str, Any], ctx: LinkContext) -> dict[str, Any]:
    """The index view."""
    ident = doc["uuid"]
    return {"id": ident, "links": ctx.links(ident), "name": doc.get("display_name") or ""}


def detail(doc: Mapping[str, Any], ctx: LinkContext) -> dict[str, Any]:
    """The detail (and show) view."""
    f = ctx.flags
    status = st.status_from_state(doc.get("state"), doc.get("task_state"))
    project = doc.get("tenant_id")
    server: dict[str, Any] = {
        "id": doc["uuid"],
        "name": doc.get("display_name") or "",
        "status": status,
        "tenant_id": project or "",
        "user_id": doc.get("user_id") or "",
        "metadata": dict(doc.get("metadata") or {}),
        "hostId": host_id(project, doc.get("host")),
        "image": _image(doc, ctx),
        "flavor": _flavor(doc, ctx),
        "created": isotime(doc.get("created_at")) or NO_TIME,
        # Nova shows "now" for a never-updated server; a fixed value keeps both paths
        # (and repeated pages) identical, so the creation time stands in.
        "updated": isotime(doc.get("updated_at") or doc.get("created_at")) or NO_TIME,
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
        "os-extended-volumes:volumes_attached": _volumes(doc, f.v2_3),
    }
    if status in st.PROGRESS_STATUSES:
        server["progress"] = doc.get("progress") or 0
    if f.admin:
        server["OS-EXT-SRV-ATTR:host"] = doc.get("host")
        server["OS-EXT-SRV-ATTR:hypervisor_hostname"] = doc.get("node")
        server["OS-EXT-SRV-ATTR:instance_name"] = doc.get("instance_name") or doc["uuid"]
        if f.v2_3:
            server["OS-EXT-SRV-ATTR:reservation_id"] = doc.get("reservation_id")
            server["OS-EXT-SRV-ATTR:launch_index"] = doc.get("launch_index") or 0
            server["OS-EXT-SRV-ATTR:kernel_id"] = doc.get("kernel_id") or ""
            server["OS-EXT-SRV-ATTR:ramdisk_id"] = doc.get("ramdisk_id") or ""
            server["OS-EXT-SRV-ATTR:root_device_name"] = None
            server["OS-EXT-SRV-ATTR:user_data"] = None
    if (f.admin and f.v2_3) or f.v2_90:
        # A reservation made without a name has none (a string for Tempest, as Nova's).
        server["OS-EXT-SRV-ATTR:hostname"] = doc.get("host_name") or ""
    if f.v2_9:
        server["locked"] = bool(doc.get("locked"))
    if f.v2_19:
        server["description"] = doc.get("display_description")
    if f.v2_26:
        server["tags"] = list(doc.get("tags") or [])
    if f.v2_63:
        server["trusted_image_certificates"] = None
    if f.v2_73:
        server["locked_reason"] = doc.get("locked_reason")
    if f.v2_96:
        server["pinned_availability_zone"] = None
    return server


def _volumes(doc: Mapping[str, Any], v2_3: bool) -> list[dict[str, Any]]:
    out = []
    for bdm in doc.get("block_devices") or []:
        if not bdm.get("volume_id"):
            continue
        volume: dict[str, Any] = {"id": bdm["volume_id"]}
        if v2_3:
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
        "created": isotime(entry.created_at) or NO_TIME,
        "links": ctx.links(entry.uuid),
    }
