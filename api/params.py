"""Query parameters of ``GET /servers[/detail]`` → one validated ``ListQuery``.

Everything a client can send is checked here, before any cell or index is touched:
an unknown parameter or a bad value is a 400 naming the parameter, an administrator's
parameter from a non-administrator a 403, as Nova words it. Semantics follow Nova's
compute API (see the README's API section for the few deliberate differences).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from cellsight.api import status as st
from cellsight.api.auth import Principal
from cellsight.api.change_times import BadDate, parse_change_time
from cellsight.api.errors import BadRequest, Forbidden, invalid_parameter
from cellsight.api.microversion import Version
from cellsight.api.options import PAGING, TAG_FILTERS, UNSUPPORTED, applicable
from cellsight.api.sort_params import parse_order
from cellsight.query.regex import validate as validate_regex
from cellsight.query.regex_syntax import MAX_LENGTH as MAX_REGEX_LENGTH
from cellsight.query.tree import (
    Compare,
    Contains,
    In,
    MatchNone,
    Node,
    Not,
    Op,
    Regex,
    SortKey,
    conjunction,
    disjunction,
)

MAX_VALUE_LENGTH = 255

REGEX_FILTERS = {  # parameter → document field; Nova matches these as regexes
    "name": "display_name",
    "ip": "ip4",
    "ip6": "ip6",
    "node": "node",
    "availability_zone": "availability_zone",
    "key_name": "key_name",
    "reservation_id": "reservation_id",
    "hostname": "host_name",
    "kernel_id": "kernel_id",
    "ramdisk_id": "ramdisk_id",
    "description": "display_description",
}
# Nova's aliases (its schema: "should be removed in the future with microversion bump").
ALIASES = {"display_name": "name", "image_ref": "image", "display_description": "description"}
# Bounds checked before any value is converted (a 400 naming the parameter).
MAX_PARAMETERS = 200
MAX_NAME_LENGTH = 64
MAX_ANY_VALUE_LENGTH = 1024
EXACT_FILTERS = {"host": "host", "user_id": "user_id", "uuid": "uuid", "flavor": "flavor_flavorid"}
MULTI = frozenset({"status", "vm_state", "task_state", "power_state", "sort_key", "sort_dir"})
KNOWN = frozenset(
    {
        "limit",
        "marker",
        "sort_key",
        "sort_dir",
        "status",
        "vm_state",
        "task_state",
        "power_state",
        "project_id",
        "tenant_id",
        "image",
        "locked",
        "changes-since",
        "changes-before",
        "deleted",
        "soft_deleted",
        "all_tenants",
        "forthcoming",
        *REGEX_FILTERS,
        *EXACT_FILTERS,
        *TAG_FILTERS,
        *ALIASES,
    }
)
_TRUE = frozenset({"1", "t", "true", "on", "y", "yes"})
_FALSE = frozenset({"0", "f", "false", "off", "n", "no"})
_ALL_TENANTS_POLICY = "os_compute_api:servers:index:get_all_tenants"


@dataclass(frozen=True)
class ListQuery:
    """One page request, validated. ``filter`` already holds the project scope."""

    filter: Node
    order: tuple[SortKey, ...]
    limit: int
    marker: str | None
    project_scope: str | None  # the one project listed, None for all projects
    # Nova's _is_cell_down_supported, less its microversion: no paging or sort parameter
    # in the request, and no search option left but all_tenants.
    down_cell_records: bool


def check_sizes(items: Sequence[tuple[str, str]]) -> None:
    """Counts and lengths, before anything is parsed or converted."""
    if len(items) > MAX_PARAMETERS:
        raise BadRequest(
            f"Invalid input for the query string: at most {MAX_PARAMETERS} parameters "
            f"(got {len(items)}).",
            parameter="query string",
        )
    for key, value in items:
        if len(key) > MAX_NAME_LENGTH:
            raise BadRequest(
                f"Invalid input for query parameters: a parameter name of {len(key)} "
                f"characters ({key[:40]!r}...) was unexpected.",
                parameter=key[:40],
            )
        if len(value) > MAX_ANY_VALUE_LENGTH:
            raise invalid_parameter(key, value, f"At most {MAX_ANY_VALUE_LENGTH} characters.")


def parse_bool(param: str, value: str, default: bool | None = None) -> bool:
    """As oslo's ``bool_from_string``: a value that is no boolean is ``default``, or a 400
    without one (``strict``)."""
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    if default is not None:
        return default
    raise invalid_parameter(
        param, value, "Expected a boolean: one of 0, 1, f, false, n, no, off, on, t, true, y, yes."
    )


def parse_time(param: str, value: str) -> datetime:
    """One ``changes-since``/``changes-before`` value, as Nova reads it (in UTC)."""
    try:
        return parse_change_time(value)
    except BadDate as exc:
        raise invalid_parameter(param, value, str(exc)) from None


def _last_time(param: str, values: list[str]) -> datetime:
    # As Nova: its schema checks every value of the repeated parameter, and the last
    # one is used (``search_opts.update(req.GET)`` takes webob's last value).
    times = [parse_time(param, _checked(param, value)) for value in values]
    return times[-1]


def check_regex(param: str, pattern: str) -> str:
    """Bounded and portable, or a 400: the same pattern runs in every cell and engine."""
    if len(pattern) > MAX_REGEX_LENGTH:
        raise invalid_parameter(
            param, pattern, f"A pattern is at most {MAX_REGEX_LENGTH} characters."
        )
    try:
        validate_regex(pattern)
    except ValueError as exc:
        raise invalid_parameter(param, pattern, f"Invalid regular expression: {exc}") from None
    return pattern


def _one(param: str, values: list[str]) -> str:
    # Like Nova (webob's MultiDict), the last of a repeated single-valued parameter wins.
    return _checked(param, values[-1])


def _each(param: str, values: list[str]) -> tuple[str, ...]:
    """Every value of a repeated (multi-valued) parameter, stripped, each checked."""
    return tuple(dict.fromkeys(_checked(param, v).strip() for v in values))


def _checked(param: str, value: str) -> str:
    if len(value) > MAX_VALUE_LENGTH and param not in REGEX_FILTERS:
        raise invalid_parameter(param, value, f"At most {MAX_VALUE_LENGTH} characters.")
    if "\x00" in value:
        raise invalid_parameter(param, value, "NUL characters are not allowed.")
    return value


def _tags(param: str, value: str) -> list[str]:
    tags = value.split(",")  # as Nova (2.26+): no strip, a tag may begin or end with spaces
    if not all(tags):
        raise invalid_parameter(param, value, "Expected a comma-separated list of non-empty tags.")
    return tags


_LIMIT = re.compile(r"[0-9]+\n?")


def parse_limit(values: list[str] | None, max_limit: int) -> int:
    if values is None:
        return max_limit
    # Nova's schema: each value matches ``^[0-9]*$`` (Python's ``$``: a final newline
    # passes) with at least one character; the last one is used.
    for raw in values:
        if _LIMIT.fullmatch(raw) is None:
            raise invalid_parameter("limit", raw, "limit must be a non-negative integer.")
    value = values[-1].rstrip("\n")
    digits = value.lstrip("0") or "0"
    # Nova caps a limit at its maximum; a huge one is capped without converting it.
    if len(digits) > len(str(max_limit)):
        return max_limit
    return min(int(digits), max_limit)


def _power_states(values: list[str]) -> Node:
    names: list[str] = []
    for value in values:
        text = value.strip().lower()
        if text.isdigit() and text.isascii():
            digits = text.lstrip("0") or "0"
            name = st.POWER_STATES.get(int(digits)) if len(digits) < 4 else None
            if name is not None:
                names.append(name)
        elif text in st.POWER_STATE_NUMBERS:
            names.append(text)
        else:
            raise invalid_parameter(
                "power_state", value, "Expected a power state number (0-7) or name."
            )
    return In("power_state", tuple(dict.fromkeys(names))) if names else MatchNone()


def parse_list_query(
    items: Sequence[tuple[str, str]],
    principal: Principal,
    *,
    max_limit: int,
    version: Version,
) -> ListQuery:
    check_sizes(items)
    raw: dict[str, list[str]] = {}
    for key, value in items:
        raw.setdefault(key, []).append(value)
    admin = principal.is_admin
    # Nova's handling first: unknown names, a member's disallowed options dropped.
    params = applicable(raw, is_admin=admin, version=version)
    for key in params:
        if key in UNSUPPORTED:
            raise BadRequest(
                f"Invalid input for query parameters {key}: Cellsight does not filter "
                f"servers by {key}.",
                parameter=key,
            )
        if key not in KNOWN:  # a name Nova's schema has and Cellsight does not act on
            raise BadRequest(
                "Invalid input for query parameters: Additional properties are not allowed "
                f"({key[:80]!r} was unexpected)",
                parameter=key,
            )
    for alias, name in ALIASES.items():
        if alias in params:
            params[name] = params.pop(alias) + params.get(name, [])
    if not admin and "all_tenants" in params and _all_tenants(params["all_tenants"]):
        raise Forbidden(f"Policy doesn't allow {_ALL_TENANTS_POLICY} to be performed.")

    limit = parse_limit(params.get("limit"), max_limit)
    marker = _one("marker", params["marker"]).strip() if "marker" in params else None
    # An empty marker is no marker, as in Nova (its build request lookup takes it for
    # none, and the cells are then asked without one).
    marker = marker or None
    order = parse_order(params.get("sort_key", []), params.get("sort_dir", []), principal, version)

    clauses: list[Node] = []
    addresses: list[Node] = []
    for param, field in REGEX_FILTERS.items():
        if param in params:
            regex = Regex(field, check_regex(param, _one(param, params[param])))
            (addresses if param in ("ip", "ip6") else clauses).append(regex)
    if addresses:
        # A server with an IPv4 address matching ``ip`` or an IPv6 one matching ``ip6``:
        # Nova's ``_ip_filter`` (and its Neutron variant) takes the union of the two.
        clauses.append(disjunction(*addresses))
    for param, field in EXACT_FILTERS.items():
        if param in params:
            clauses.append(Compare(field, Op.EQ, _one(param, params[param])))
    if "image" in params:
        # A URL to the image is accepted, as in Nova: its last path segment is the id.
        image = _one("image", params["image"]).split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        clauses.append(Compare("image_uuid", Op.EQ, image))
    deleted: bool | None = None
    if "vm_state" in params:
        # A plain filter, as in Nova: only the deleted *status* lists deleted servers
        # (``_get_servers`` compares the status-made list; a vm_state parameter is a
        # string there), so vm_state=deleted alone lists nothing, for anyone.
        clauses.append(In("state", _each("vm_state", params["vm_state"])))
    if "task_state" in params:
        clauses.append(In("task_state", _each("task_state", params["task_state"])))
    if "power_state" in params:
        clauses.append(_power_states(params["power_state"]))
    if "locked" in params:
        locked = parse_bool("locked", _one("locked", params["locked"]))
        clauses.append(Compare("locked", Op.EQ, locked))
    clauses.extend(_tag_clauses(params))

    if "status" in params:
        given = [s.strip().upper() for s in params["status"]]
        # As Nova's task_and_vm_state_from_status: an unknown status is ignored beside a
        # known one; with none known, a 400 from 2.38, an empty listing before.
        statuses = [s for s in given if s in st.STATUSES]
        if not statuses:
            if version.at_least("2.38"):
                raise invalid_parameter("status", given[-1], "Invalid status value.")
            clauses.append(MatchNone())  # Nova answers an empty list
        else:
            if set(statuses) == {"DELETED"}:
                # Nova: listing by the deleted status lists deleted servers, admins only.
                if not admin:
                    raise Forbidden("Only administrators may list deleted instances")
                deleted = True
            clauses.append(st.status_filter(statuses))

    since = before = None
    if "changes-since" in params:
        since = _last_time("changes-since", params["changes-since"])
        clauses.append(Compare("updated_at", Op.GE, since))
    if "changes-before" in params:
        before = _last_time("changes-before", params["changes-before"])
        clauses.append(Compare("updated_at", Op.LE, before))
    if since is not None and before is not None and since > before:
        raise invalid_parameter(
            "changes-since",
            params["changes-since"][-1],
            "The value of changes-since must be less than or equal to changes-before.",
        )
    if "deleted" in params:
        # Nova's ``bool_from_string(default=False)``: a value that is no boolean lists
        # the servers that are not deleted ("Return non-deleted servers if an invalid
        # value is passed", ``_get_servers``), where ``locked`` and ``all_tenants`` 400.
        explicit = parse_bool("deleted", _one("deleted", params["deleted"]), default=False)
        # Nova converts ``deleted`` first and then lets the deleted status override it
        # (``_get_servers``): ``openstack server list --status DELETED`` sends deleted=False.
        deleted = True if deleted else explicit
    elif deleted is None and since is None and before is None:
        # Deleted servers are listed only on request, or as changes (as in Nova).
        deleted = False
    if deleted is not None:
        # Nova hands ``soft_deleted`` (administrators only) to its database layer as the
        # string given: any non-empty value is true (not a boolean parse).
        soft = params["soft_deleted"][-1] != "" if "soft_deleted" in params else None
        clauses.append(st.deleted_filter(deleted, soft))
    # Reservations only on request: a Nova client never sees one (Nova's own payloads
    # carry no "forthcoming", hence "not true" rather than "== false").
    if "forthcoming" in params and parse_bool(
        "forthcoming", _one("forthcoming", params["forthcoming"])
    ):
        clauses.append(Compare("forthcoming", Op.EQ, True))
    else:
        clauses.append(Not(Compare("forthcoming", Op.EQ, True)))

    scope = _scope(params, principal)
    if scope is not None:
        clauses.append(Compare("tenant_id", Op.EQ, scope))
    down_cells = not PAGING & raw.keys() and set(params) - PAGING <= {"all_tenants"}
    return ListQuery(conjunction(*clauses), order, limit, marker, scope, down_cells)


def _tag_clauses(params: dict[str, list[str]]) -> list[Node]:
    out: list[Node] = []
    if "tags" in params:
        tags = _tags("tags", _one("tags", params["tags"]))
        out.append(conjunction(*(Contains("tags", t) for t in tags)))
    if "tags-any" in params:
        tags = _tags("tags-any", _one("tags-any", params["tags-any"]))
        out.append(disjunction(*(Contains("tags", t) for t in tags)))
    if "not-tags" in params:
        tags = _tags("not-tags", _one("not-tags", params["not-tags"]))
        out.append(Not(conjunction(*(Contains("tags", t) for t in tags))))
    if "not-tags-any" in params:
        tags = _tags("not-tags-any", _one("not-tags-any", params["not-tags-any"]))
        out.append(Not(disjunction(*(Contains("tags", t) for t in tags))))
    return out


def _all_tenants(values: list[str]) -> bool:
    """Nova's ``is_all_tenants``: present and empty, or a true boolean."""
    value = values[-1]
    if value == "":
        return True
    return parse_bool("all_tenants", value)


def _scope(params: dict[str, list[str]], principal: Principal) -> str | None:
    """The one project a request lists, or None for all.

    Non-administrators: their own project, always. Administrators: their own project
    too (Nova's default) unless ``all_tenants`` is true or they filter by a project,
    which implies all tenants (what Nova's bug 1185290 asks for).
    """
    if not principal.is_admin:
        return principal.project_id
    for param in ("project_id", "tenant_id"):
        if param in params:
            # Exact, as ``user_id`` and as Nova's exact-match filters: a project id with
            # spaces around it names another project (none), not this one.
            value = _one(param, params[param])
            if not value:
                raise invalid_parameter(param, value, f"{param} must not be empty.")
            other = "tenant_id" if param == "project_id" else "project_id"
            if other in params and _one(other, params[other]) != value:
                raise invalid_parameter(
                    param, value, "project_id and tenant_id name different projects."
                )
            return value
    if "all_tenants" in params and _all_tenants(params["all_tenants"]):
        return None
    return principal.project_id
