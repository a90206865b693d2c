"""The in-memory evaluator (node queries, skipped-cell rows) agrees with the index.

Random valid filters, with values the data holds, select the same documents in Python
(``cellsight.api.query2.evaluate``) as in the embedded index's SQL; and a filter on fields an
instance mapping knows decides a placeholder exactly as it decides the full document.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cellsight.api.query2.evaluate import evaluate
from cellsight.api.query2.fields import COMPUTED, REGISTRY
from cellsight.api.query2.instances import MAPPING_FIELDS
from cellsight.api.query2.sexpr import MAX_DEPTH, parse, parse_filter
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.query.tree import MatchAll, Node, SearchRequest, SortKey
from tests.support.api_world import World, build_world, load_index
from tests.support.query2_filters import depth, filters
from tests.support.query2_world import instance_documents, load_nodes, node_documents


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = build_world(tmp_path_factory.mktemp("q2-eval"), "sqlite")
    yield w
    w.close()


@pytest.fixture(scope="module")
def engine(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedEngine]:
    eng = EmbeddedEngine(tmp_path_factory.mktemp("q2-eval-index") / "index.db", prefix="ev")
    load_index(eng, world)
    load_nodes(eng, world)
    yield eng
    eng.close()


def pool(resource: str, docs: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Registry name → values the documents hold (list elements for list fields)."""
    out: dict[str, list[Any]] = {}
    for name, field in REGISTRY[resource].items():
        if not field.filterable or field.computed:
            continue
        values: set[Any] = set()
        for doc in docs:
            value = doc.get(field.doc_field)
            for v in value if isinstance(value, list) else [value]:
                if v is not None:
                    values.add(v)
        out[name] = sorted(values, key=repr)[:40]
    return out


@pytest.fixture(scope="module")
def data(world: World) -> dict[str, list[dict[str, Any]]]:
    return {"instance": instance_documents(world), "node": node_documents(world)}


@pytest.fixture(scope="module")
def strategies(data: dict[str, list[dict[str, Any]]]) -> dict[str, st.SearchStrategy[Any]]:
    # Built once: a strategy over every field costs more to build than to draw from.
    return {
        resource: filters(resource, pool(resource, docs), max_leaves=6)
        for resource, docs in data.items()
    }


DERIVED = frozenset(f.name for f in COMPUTED["node"])


def _in_index(engine: EmbeddedEngine, resource: str, tree: Node) -> list[str]:
    found = engine.search(resource, SearchRequest(tree, (SortKey("uuid"),), 10_000))
    return [s.id for s in found]


def _in_python(docs: list[dict[str, Any]], tree: Node) -> list[str]:
    return sorted(str(d["uuid"]) for d in docs if evaluate(tree, d) is True)


@pytest.mark.parametrize("resource", ["instance", "node"])
def test_match_all_is_everything(
    engine: EmbeddedEngine, data: dict[str, list[dict[str, Any]]], resource: str
) -> None:
    assert _in_python(data[resource], MatchAll()) == _in_index(engine, resource, MatchAll())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resource=st.sampled_from(["instance", "node"]), draw=st.data())
def test_python_and_index_select_the_same(
    engine: EmbeddedEngine,
    data: dict[str, list[dict[str, Any]]],
    strategies: dict[str, st.SearchStrategy[Any]],
    resource: str,
    draw: st.DataObject,
) -> None:
    raw = draw.draw(strategies[resource])
    assume(depth(raw) <= MAX_DEPTH)  # too deep is refused: test_query2_sexpr checks that
    # Fields each node snapshot adds are only ever evaluated in memory (no engine holds
    # them): test_query2_http checks them on both paths.
    assume(not parse(resource, raw).fields & DERIVED)
    tree = parse_filter(resource, raw)
    assert _in_python(data[resource], tree) == _in_index(engine, resource, tree), raw


_mapping_only = {n: f for n, f in REGISTRY["instance"].items() if f.doc_field in MAPPING_FIELDS}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(draw=st.data())
def test_a_decided_placeholder_agrees_with_its_document(
    data: dict[str, list[dict[str, Any]]],
    strategies: dict[str, st.SearchStrategy[Any]],
    draw: st.DataObject,
) -> None:
    docs = data["instance"]
    raw = draw.draw(strategies["instance"])
    assume(depth(raw) <= MAX_DEPTH)  # too deep is refused: test_query2_sexpr checks that
    tree = parse_filter("instance", raw)
    for doc in docs:
        placeholder = {k: doc[k] for k in MAPPING_FIELDS}
        decided = evaluate(tree, placeholder, MAPPING_FIELDS)
        # Unknown fields make it undecided, never wrong.
        assert decided is None or decided == evaluate(tree, doc), raw
