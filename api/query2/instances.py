"""Instance queries: the index or the fan-out path (``cellsight.api.paths``), or a direct lookup.

* **Walk**: every matching instance in ``uuid`` order, one ``InstanceSearch`` page at a
  time (``settings.max_limit`` rows) with a keyset on the last uuid, so the index and
  the fan-out path (and a switch between them mid-walk) give the same rows.
* **Direct lookup**: a filter that only names instances (``==`` on ``uuid`` or
  ``name``, alone or under ``|``) never touches the index: uuids are located through
  the instance mappings and only their cells are read; names (not in the mappings) are
  read from the cells the caller may see. A client that just booted an instance finds
  it even before the indexer has caught up, and the answer survives the index.
* **Skipped cells** (fan-out and lookup): their instances appear with status 2 when the
  filter selects them on what their mapping knows (uuid, project, user, cell, deleted);
  those it cannot decide without the cell (a name filter, say) are left out.
* Deleted instances are left out unless the filter names ``deleted`` (as Nova lists).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from starlette.datastructures import State

from cellsight.api.auth import Principal
from cellsight.api.cell_documents import search_cell
from cellsight.api.driver_errors import API_DB_FAILURES
from cellsight.api.errors import BadRequest, unavailable
from cellsight.api.fanout import FanOut, SkippedCell
from cellsight.api.paths import InstanceSearch, scope
from cellsight.api.query2.evaluate import Deadline, evaluate
from cellsight.cells.database import connect
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.schema import instance_mappings
from cellsight.query.tree import (
    Compare,
    Node,
    Op,
    Or,
    SearchRequest,
    SortKey,
    conjunction,
)

BY_UUID = (SortKey("uuid"),)
# The most instances one query answers; more is a 400 asking for a narrower filter
# (query2 has no paging, and one response must stay a sane size).
MAX_ROWS = 10_000
LOOKUP_FIELDS = ("uuid", "display_name")
# What an instance mapping tells about an instance whose cell did not answer.
MAPPING_FIELDS = frozenset({"uuid", "tenant_id", "user_id", "cell_uuid", "deleted"})


@dataclass
class InstanceAnswer:
    documents: list[dict[str, Any]]  # complete documents, uuid order
    placeholders: list[dict[str, Any]] = field(default_factory=list)  # MAPPING_FIELDS only
    path: str = "index"  # "index", "fanout" or "lookup"
    skipped: list[SkippedCell] = field(default_factory=list)


def too_many(limit: int) -> BadRequest:
    return BadRequest(
        f"The query matches more than {limit} instances; narrow the filter", parameter="filter"
    )


def lookup_keys(tree: Node) -> tuple[set[str], set[str]] | None:
    """(uuids, names) when ``tree`` only names instances, else ``None``."""
    uuids: set[str] = set()
    names: set[str] = set()

    def walk(node: Node) -> bool:
        if isinstance(node, Or):
            return all(walk(child) for child in node.children)
        if (
            isinstance(node, Compare)
            and node.op is Op.EQ
            and node.field in LOOKUP_FIELDS
            and isinstance(node.value, str)
        ):
            (uuids if node.field == "uuid" else names).add(node.value)
            return True
        return False

    return (uuids, names) if walk(tree) else None


def with_defaults(tree: Node, referenced: frozenset[str]) -> Node:
    if "deleted" in referenced:
        return tree
    return conjunction(tree, Compare("deleted", Op.EQ, False))


def query_instances(
    state: State,
    principal: Principal,
    tree: Node,
    referenced: frozenset[str],
    *,
    max_rows: int | None = None,
    deadline: Deadline | None = None,
) -> InstanceAnswer:
    """``deadline`` bounds the evaluation of the placeholders (``EvaluationDeadline``);
    by default ``search_timeout`` from their start."""
    max_rows = MAX_ROWS if max_rows is None else max_rows
    full = with_defaults(tree, referenced)
    keys = lookup_keys(tree)
    if keys is not None:
        answer = _lookup(state, principal, full, *keys, max_rows=max_rows)
    else:
        answer = _walk(state.search, principal, full, state.settings.max_limit, max_rows)
    if answer.skipped:
        project = None if principal.is_admin else principal.project_id
        answer.placeholders = _placeholders(
            state.registry,
            answer,
            full,
            project,
            max_rows - len(answer.documents),
            deadline or Deadline(state.settings.search_timeout),
        )
    return answer


def _walk(
    search: InstanceSearch, principal: Principal, tree: Node, page: int, max_rows: int
) -> InstanceAnswer:
    answer = InstanceAnswer([])
    paths: set[str] = set()
    seen_skipped: dict[str, SkippedCell] = {}
    after: tuple[Any, ...] | None = None
    while True:
        got = search.search(SearchRequest(tree, BY_UUID, page, after), principal)
        paths.add(got.path)
        answer.documents.extend(got.documents)
        for skipped in got.skipped:
            seen_skipped.setdefault(skipped.uuid, skipped)
        if len(answer.documents) > max_rows:
            raise too_many(max_rows)
        if len(got.documents) < page:
            break
        after = (got.documents[-1]["uuid"],)
    answer.path = "fanout" if "fanout" in paths else "index"
    answer.skipped = sorted(seen_skipped.values(), key=lambda s: s.name)
    return answer


def _lookup(
    state: State,
    principal: Principal,
    tree: Node,
    uuids: set[str],
    names: set[str],
    *,
    max_rows: int,
) -> InstanceAnswer:
    registry: CellRegistry = state.registry
    search: InstanceSearch = state.search
    fanout: FanOut = state.fanout
    project = None if principal.is_admin else principal.project_id
    cell_ids = set(_mapped_cells(registry, sorted(uuids), project).values())
    if names:
        cell_ids.update(c.uuid for c in search.cells_for(project))
    cells = [c for c in _list_cells(registry) if c.uuid in cell_ids]
    # The same scoped filter the fan-out path sends, so a lookup answers exactly as
    # a walk would, only from fewer cells.
    request = scope(SearchRequest(tree, BY_UUID, max_rows + 1), principal, None)
    results = fanout.map_cells(cells, lambda cell, conn: search_cell(conn, request, cell.uuid))
    documents = sorted(
        (doc for docs in results.results.values() for doc in docs), key=lambda d: str(d["uuid"])
    )
    if len(documents) > max_rows:
        raise too_many(max_rows)
    return InstanceAnswer(documents, path="lookup", skipped=results.skipped)


def _api_db(what: Callable[[sa.Connection], Any], registry: CellRegistry) -> Any:
    try:
        with connect(registry.api_engine) as conn:
            return what(conn)
    except API_DB_FAILURES as exc:
        raise unavailable("The API database is unavailable", exc) from None


def _list_cells(registry: CellRegistry) -> list[Any]:
    try:
        return registry.list_cells()
    except API_DB_FAILURES as exc:
        raise unavailable("The API database is unavailable", exc) from None


def _mapped_cells(registry: CellRegistry, uuids: list[str], project: str | None) -> dict[str, str]:
    """instance uuid → cell uuid, for the mapped instances the caller may see."""
    if not uuids:
        return {}
    m = instance_mappings.c
    query = sa.select(m.instance_uuid, m.cell_uuid).where(
        m.instance_uuid.in_(uuids), m.cell_uuid.is_not(None)
    )
    if project is not None:
        query = query.where(m.project_id == project)
    rows = _api_db(lambda conn: conn.execute(query).all(), registry)
    return {r.instance_uuid: r.cell_uuid for r in rows}


def _placeholders(
    registry: CellRegistry,
    answer: InstanceAnswer,
    tree: Node,
    project: str | None,
    room: int,
    deadline: Deadline,
) -> list[dict[str, Any]]:
    """The mapping's view of instances in skipped cells that ``tree`` surely selects."""
    m = instance_mappings.c
    query = (
        sa.select(m.instance_uuid, m.cell_uuid, m.project_id, m.user_id, m.queued_for_delete)
        .where(m.cell_uuid.in_([s.uuid for s in answer.skipped]))
        .order_by(m.instance_uuid)
    )
    if project is not None:
        query = query.where(m.project_id == project)
    rows = _api_db(lambda conn: conn.execute(query).all(), registry)
    # A cell skipped on one page of a walk may have answered another.
    have = {doc["uuid"] for doc in answer.documents}
    out: list[dict[str, Any]] = []
    for row in rows:
        if row.instance_uuid in have:
            continue
        deadline.check()
        doc = {
            "uuid": row.instance_uuid,
            "tenant_id": row.project_id,
            "user_id": row.user_id,
            "cell_uuid": row.cell_uuid,
            "deleted": bool(row.queued_for_delete),
        }
        if evaluate(tree, doc, MAPPING_FIELDS) is True:
            out.append(doc)
            if len(out) > room:
                raise too_many(len(answer.documents) + room)
    return out
