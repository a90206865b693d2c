"""Query parameters of ``GET /servers[/detail]`` → one validated ``ListQuery``.

Everything a client can send is checked here, before any cell or index is touched:
an unknown parameter or a bad value is a 400 naming the parameter, an administrator's
parameter from a non-administrator a 403, as Nova words it. Semantics follow Nova's
compute API (see the README's API section for the few deliberate differences).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cellsight.api import status as st
from cellsight.api.auth import Principal
from cellsight.api.errors import BadRequest, Forbidden, invalid_parameter
from cellsight.api.microversion import Version
from cellsight.api.options import PAGING, TAG_FILTERS, UNSUPPORTED, applicable
from cellsight.api.param_values import (
    REGEX_FILTERS,
    last,
    last_time,
    one,
    parse_bool,
    parse_limit,
    power_states,
    regex_filter,
    tag_clauses,
)
from cellsight.api.sort_params import parse_order
from cellsight.query.tree import (
    Compare,
    In,
    MatchNone,
    Node,
    Not,
    Op,
    SortKey,
    conjunction,
    disjunction,
)

# Nova's aliases (its schema: "should be removed in the future with microversion bump"):
# Nova's ``get_all`` remaps ``name`` and ``image`` onto ``display_name`` and
# ``image_ref``, so of a pair the one named later in the query string wins.
ALIASES = {"display_name": "name", "image_ref": "image"}
# In Nova's schema but no filter there: ``get_all`` passes it on as it is, and its
# database layer skips a name that is no Instance column (the column is
# ``display_description``, whose own parameter does filter).
IGNORED = frozenset({"description"})
# Bounds checked before any value is converted (a 400 naming the parameter).
MAX_PARAMETERS = 200
MAX_NAME_LENGTH = 64
MAX_ANY_VALUE_LENGTH = 1024
EXACT_FILTERS = {"host": "host", "user_id": "user_id", "uuid": "uuid", "flavor": "flavor_flavorid"}
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
        *IGNORED,
    }
)
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
    appeared = list(params)  # the order of first appearance: Nova's ``search_opts``
    for alias, name in ALIASES.items():
        if alias in params:
            values = params.pop(alias)
            if name in params:
                later_alias = appeared.index(alias) > appeared.index(name)
                values = params[name] + values if later_alias else values + params[name]
            params[name] = values
    if not admin and "all_tenants" in params and _all_tenants(params["all_tenants"]):
        raise Forbidden(f"Policy doesn't allow {_ALL_TENANTS_POLICY} to be performed.")

    limit = parse_limit(params.get("limit"), max_limit)
    marker = one("marker", params["marker"]) if "marker" in params else None
    # An empty marker is no marker, as in Nova (its build request lookup takes it for
    # none, and the cells are then asked without one); any other is looked up as given
    # (Nova's ``marker [ ] not found`` for a space).
    marker = marker or None
    order = parse_order(params.get("sort_key", []), params.get("sort_dir", []), principal, version)

    clauses: list[Node] = []
    addresses: list[Node] = []
    for param, field in REGEX_FILTERS.items():
        if param in params:
            pattern = one(param, params[param])
            if param in ("ip", "ip6"):
                # Nova asks Neutron for the ports of each non-empty address: an empty
                # one adds no server (``_ip_filter_using_neutron``).
                addresses.append(regex_filter(param, field, pattern) if pattern else MatchNone())
            else:
                clauses.append(regex_filter(param, field, pattern))
    if addresses:
        # A server with an IPv4 address matching ``ip`` or an IPv6 one matching ``ip6``:
        # Nova's ``_ip_filter`` (and its Neutron variant) takes the union of the two.
        clauses.append(disjunction(*addresses))
    for param, field in EXACT_FILTERS.items():
        if param in params:
            clauses.append(Compare(field, Op.EQ, one(param, params[param])))
    if "image" in params:
        # A URL to the image is accepted, as in Nova: its last path segment is the id.
        image = one("image", params["image"]).split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        clauses.append(Compare("image_uuid", Op.EQ, image))
    deleted: bool | None = None
    if "vm_state" in params:
        # A plain filter, as in Nova: only the deleted *status* lists deleted servers
        # (``_get_servers`` compares the status-made list; a vm_state parameter is a
        # string there), so vm_state=deleted alone lists nothing, for anyone.
        # Repeated, the last value is the filter (webob's, through ``search_opts``);
        # only ``status`` is read with ``getall``.
        clauses.append(In("state", (last("vm_state", params["vm_state"]),)))
    if "task_state" in params:
        clauses.append(In("task_state", (last("task_state", params["task_state"]),)))
    if "power_state" in params:
        clauses.append(power_states(params["power_state"]))
    if "locked" in params:
        locked = parse_bool("locked", one("locked", params["locked"]))
        clauses.append(Compare("locked", Op.EQ, locked))
    clauses.extend(tag_clauses(params))

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
        since = last_time("changes-since", params["changes-since"])
        clauses.append(Compare("updated_at", Op.GE, since))
    if "changes-before" in params:
        before = last_time("changes-before", params["changes-before"])
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
        explicit = parse_bool("deleted", one("deleted", params["deleted"]), default=False)
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
        "forthcoming", one("forthcoming", params["forthcoming"])
    ):
        clauses.append(Compare("forthcoming", Op.EQ, True))
    else:
        clauses.append(Not(Compare("forthcoming", Op.EQ, True)))

    scope = _scope(params, principal)
    if scope is not None:
        clauses.append(Compare("tenant_id", Op.EQ, scope))
    down_cells = not PAGING & raw.keys() and set(params) - PAGING <= {"all_tenants"}
    return ListQuery(conjunction(*clauses), order, limit, marker, scope, down_cells)


def _all_tenants(values: list[str]) -> bool:
    """Nova's ``is_all_tenants``: present and empty, or a true boolean."""
    value = values[-1]
    if value == "":
        return True
    return parse_bool("all_tenants", value)


def _scope(params: dict[str, list[str]], principal: Principal) -> str | None:
    """The one project a request lists, or None for all.

    As Nova's ``_get_servers``: without a true ``all_tenants`` everyone lists their own
    project (``tenant_id`` is ignored and ``project_id`` overwritten, after its
    lp:#1185290); with it an administrator lists every project, or the one named by
    ``project_id`` or ``tenant_id``, exactly (the one named later in the query string
    wins, as ``get_all`` remaps ``tenant_id`` onto ``project_id`` in that order; an
    empty one matches no server).
    """
    if not principal.is_admin:
        return principal.project_id
    if not ("all_tenants" in params and _all_tenants(params["all_tenants"])):
        return principal.project_id
    named = [p for p in params if p in ("project_id", "tenant_id")]
    if not named:
        return None
    return one(named[-1], params[named[-1]])
    for param in ("project_id", "tenant_id"):
        if param in params:
            # Exact, as ``user_id`` and as Nova's exact-match filters: a project id with
            # spaces around it names another project (none), not this one.
            value = one(param, params[param])
            if not value:
                raise invalid_parameter(param, value, f"{param} must not be empty.")
            other = "tenant_id" if param == "project_id" else "project_id"
            if other in params and one(other, params[other]) != value:
                raise invalid_parameter(
                    param, value, "project_id and tenant_id name different projects."
                )
            return value
    if "all_tenants" in params and _all_tenants(params["all_tenants"]):
        return None
    return principal.project_id
