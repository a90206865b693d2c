"""Which of a request's query parameters Nova would act on, per caller and microversion.

Facts from Nova's ``servers.py`` (``_get_servers``, ``_get_server_search_options``,
``remove_invalid_options``) and its query schemas (``schemas/servers.py``):

* A parameter Nova's schema for the microversion does not know is dropped below 2.75
  (``additionalProperties: True``, stripped) and a 400 from 2.75 on.
* A caller without ``allow_all_filters`` (a non-administrator) has every search option
  outside the allowed list for the microversion silently dropped (``deleted``,
  ``host``, ``node``, ``project_id``, ``uuid``…); paging and sort parameters are not
  search options and stay.
* Only these are 403 for such a caller: a true ``all_tenants``, and listing deleted
  servers (``status=DELETED``, or ``vm_state=deleted`` where ``vm_state`` is allowed,
  2.83+). Sorting by ``host``/``node`` is a 403 too (``cellsight.api.sort_params``).
* Joined-table names and names starting with ``_`` that survive are a 400
  ("Invalid filter field").
"""

from __future__ import annotations

import logging

from cellsight.api.errors import BadRequest
from cellsight.api.microversion import Version

log = logging.getLogger(__name__)

PAGING = frozenset({"limit", "marker", "sort_key", "sort_dir"})
TAG_FILTERS = ("tags", "tags-any", "not-tags", "not-tags-any")
# In Nova's query schema, but not filters Cellsight applies: data it does not hold
# (launch_index, config_drive, ...) or exact-instant matches of a time, which Nova's
# database layer compares as given (a 400 naming the parameter).
UNSUPPORTED = frozenset(
    {
        "launch_index",
        "locked_by",
        "root_device_name",
        "config_drive",
        "access_ip_v4",
        "access_ip_v6",
        "auto_disk_config",
        "progress",
        "launched_at",
        "terminated_at",
        "created_at",
        "page_reverse",
    }
)
JOINED_TABLE = frozenset(
    {
        "block_device_mapping",
        "services",
        "metadata",
        "system_metadata",
        "info_cache",
        "security_groups",
        "pci_devices",
    }
)
# Nova's ``index_query`` (2.1) property names.
BASE_SCHEMA = frozenset(
    {
        "user_id",
        "project_id",
        "tenant_id",
        "launch_index",
        "image_ref",
        "image",
        "kernel_id",
        "ramdisk_id",
        "hostname",
        "key_name",
        "power_state",
        "vm_state",
        "task_state",
        "host",
        "node",
        "flavor",
        "reservation_id",
        "launched_at",
        "terminated_at",
        "availability_zone",
        "name",
        "display_name",
        "description",
        "display_description",
        "locked_by",
        "uuid",
        "root_device_name",
        "config_drive",
        "access_ip_v4",
        "access_ip_v6",
        "auto_disk_config",
        "progress",
        "sort_key",
        "sort_dir",
        "all_tenants",
        "soft_deleted",
        "deleted",
        "status",
        "changes-since",
        "ip",
        "ip6",
        "created_at",
        "limit",
        "marker",
        "page_reverse",
        *JOINED_TABLE,
    }
)
# Parameters added to the schema by later microversions.
ADDED_IN = {**dict.fromkeys(TAG_FILTERS, "2.26"), "changes-before": "2.66", "locked": "2.73"}

# ``_get_server_search_options``: what a non-administrator may search by, from when.
MEMBER_OPTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "2.1",
        (
            "reservation_id",
            "name",
            "status",
            "image",
            "flavor",
            "ip",
            "changes-since",
            "all_tenants",
        ),
    ),
    ("2.5", ("ip6",)),
    ("2.26", TAG_FILTERS),
    ("2.66", ("changes-before",)),
    ("2.73", ("locked",)),
    (
        "2.83",
        (
            "availability_zone",
            "config_drive",
            "key_name",
            "created_at",
            "launched_at",
            "terminated_at",
            "power_state",
            "task_state",
            "vm_state",
            "progress",
            "user_id",
        ),
    ),
    ("2.90", ("hostname",)),
)


# Cellsight's own parameters, at every microversion and for every caller: ``forthcoming``
# lists reservations (never listed without it, so Nova's clients see nothing new).
EXTENSIONS = frozenset({"forthcoming"})


def known(name: str, version: Version) -> bool:
    """Whether Nova's query schema for ``version`` (or Cellsight's) names ``name``."""
    if name in EXTENSIONS:
        return True
    if name.startswith("_"):
        return True  # the schema's ``patternProperties``: kept, and refused later
    if name in BASE_SCHEMA:
        return True
    since = ADDED_IN.get(name)
    return since is not None and version.at_least(since)


def member_options(version: Version) -> frozenset[str]:
    allowed: set[str] = set(PAGING) | EXTENSIONS
    for since, names in MEMBER_OPTIONS:
        if version.at_least(since):
            allowed.update(names)
    return frozenset(allowed)


def applicable(
    params: dict[str, list[str]], *, is_admin: bool, version: Version
) -> dict[str, list[str]]:
    """``params`` as Nova acts on them: unknown ones dropped (or a 400 from 2.75), a
    non-administrator's disallowed search options dropped, forbidden names a 400."""
    out: dict[str, list[str]] = {}
    for name, values in params.items():
        if known(name, version):
            out[name] = values
        elif version.at_least("2.75"):
            raise BadRequest(
                "Invalid input for query parameters: Additional properties are not allowed "
                f"({name[:80]!r} was unexpected)",
                parameter=name[:80],
            )
    if not is_admin:
        allowed = member_options(version)
        dropped = sorted(n for n in out if n not in allowed)
        if dropped:
            log.debug("Removing options %s from query", ", ".join(n[:80] for n in dropped))
        out = {n: v for n, v in out.items() if n in allowed}
    for name in out:
        if name in JOINED_TABLE or name.startswith("_"):
            raise BadRequest(f"Invalid filter field: {name[:80]}.", parameter=name[:80])
    return out
