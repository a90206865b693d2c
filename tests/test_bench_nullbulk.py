"""The benchmarks' null bulk endpoint answers everything the indexer asks of an HTTP
engine, at its first start and at a restart on the indexes it made (where the writer
checks their mapping for missing fields): a benchmark of the HTTP path that dies on a
request the endpoint does not know measures nothing."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cellsight.indexer.engines.opensearch import OpenSearchEngine
from cellsight.indexer.outcomes import Verdict
from cellsight.indexer.writer import BatchWriter
from tests.support import novagen

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def null_bulk(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # the benchmarks import ``bench.*``
    server = importlib.import_module("bench.nullbulk").NullBulkServer.start()
    yield server
    server.close()


def test_the_indexer_writes_through_the_null_bulk_endpoint_and_restarts_on_it(
    null_bulk: Any,
) -> None:
    bodies = [novagen.body(novagen.notification(seed=seed)) for seed in range(30)]
    for _ in range(2):  # a second writer finds the indexes the first one made
        engine = OpenSearchEngine(null_bulk.url, prefix="bench", timeout=10.0)
        outcomes = BatchWriter(engine, record_metrics=False).write(bodies)
        engine.close()
        assert {o.verdict for o in outcomes} <= {Verdict.INDEXED, Verdict.IGNORED}
        assert Verdict.INDEXED in {o.verdict for o in outcomes}
