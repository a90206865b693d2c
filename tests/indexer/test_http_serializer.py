"""The HTTP engines' orjson serializers write what the clients' stdlib ones wrote (same
JSON value), and what orjson refuses still goes out the stdlib way instead of failing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from elasticsearch.serializer import JsonSerializer
from hypothesis import given
from hypothesis import strategies as st
from opensearchpy.serializer import JSONSerializer

from cellsight.indexer.engines.elasticsearch import ElasticsearchEngine
from cellsight.indexer.engines.opensearch import OpenSearchEngine, OrjsonSerializer

documents = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=30,
)


@given(documents)
def test_same_json_value_as_the_stdlib_serializer(document: Any) -> None:
    ours, theirs = OrjsonSerializer(), JSONSerializer()
    body = {"doc": document}
    assert json.loads(ours.dumps(body)) == json.loads(theirs.dumps(body))
    assert ours.loads(theirs.dumps(body)) == body


@pytest.mark.parametrize("odd", [{"n": 10**30}, {"s": "\ud800"}])
def test_what_orjson_refuses_takes_the_stdlib_way(odd: dict[str, Any]) -> None:
    assert OrjsonSerializer().dumps(odd) == JSONSerializer().dumps(odd)


def test_the_clients_are_built_with_orjson() -> None:
    opensearch = OpenSearchEngine("http://127.0.0.1:9", prefix="t")
    elastic = ElasticsearchEngine("http://127.0.0.1:9", prefix="t")
    assert isinstance(opensearch.client.transport.serializer, OrjsonSerializer)
    es_json = elastic.client.transport.serializers.get_serializer("application/json")
    assert type(es_json).__name__ == "OrjsonSerializer"
    assert isinstance(es_json, JsonSerializer)
