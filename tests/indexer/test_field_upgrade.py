"""An HTTP index made before a field was added to the registry gets the field at the
writer's first batch: its mapping is strict, so documents holding the field would be
refused otherwise (here ``tags_version``, added after indexes existed in the field)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from cellsight.indexer.engines.base import SearchEngine, WriteOp, WriteStatus
from cellsight.indexer.engines.http_core import HttpCore
from cellsight.indexer.outcomes import Verdict
from cellsight.indexer.planning import EventInfo, Planned
from cellsight.indexer.writer import BatchWriter
from tests.support.http_engines import make_engine
from tests.support.services import osmem_clone_url

pytestmark = pytest.mark.services


@pytest.fixture(params=["elasticsearch", "opensearch"])
def old_index(request: pytest.FixtureRequest) -> Iterator[SearchEngine]:
    """An engine whose instance index has the mapping of before ``tags_version``."""
    url, prefix = osmem_clone_url(request), f"t{uuid.uuid4().hex[:8]}"
    engine = make_engine(str(request.param), url, prefix=prefix, timeout=10.0)
    assert isinstance(engine, HttpCore)
    body: dict[str, Any] = engine._index_body("instance", bulk_load=False)
    del body["mappings"]["properties"]["tags_version"]
    body["aliases"] = {engine.read_alias("instance"): {}, engine.write_alias("instance"): {}}
    engine._send("PUT", f"/{engine.prefix}-instance-20250101000000000000", body=body)
    yield engine
    engine.close()


def test_the_writer_adds_the_missing_field_and_writes(old_index: SearchEngine) -> None:
    doc_id = str(uuid.uuid4())
    doc = {"uuid": doc_id, "display_name": "vm", "version": 3, "tags": ["a"], "tags_version": 3}
    [refused] = old_index.bulk([WriteOp("instance", doc_id, 3, doc)])
    assert refused.status is WriteStatus.REJECTED  # the premise: strict, and no such field

    writer = BatchWriter(old_index, record_metrics=False)
    info = EventInfo("instance.power_off.end", datetime.now(UTC))
    tagless = {"uuid": doc_id, "display_name": "vm", "version": 4}
    planned = Planned(0, WriteOp("instance", doc_id, 4, tagless), info, None)
    [outcome] = writer.commit([None], [planned])
    assert outcome.verdict is Verdict.INDEXED, outcome
    old_index.refresh("instance")
    stored = old_index.get("instance", doc_id)
    assert stored is not None and stored.document["tags_version"] == 0
    # Idempotent: a second writer finds nothing to add.
    BatchWriter(old_index, record_metrics=False).commit(
        [None], [Planned(0, WriteOp("instance", doc_id, 5, dict(tagless)), info, None)]
    )
    old_index.refresh("instance")
    assert old_index.get("instance", doc_id).version == 5  # type: ignore[union-attr]
