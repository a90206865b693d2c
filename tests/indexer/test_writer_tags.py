"""The writer's tags merge on every engine: a document built from a payload without
tags takes the stored document's tags, which the writer reads with ``get_many(...,
fields=("tags",))`` (on the HTTP engines a ``_source_includes`` projection)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from cellsight.indexer.engines.base import SearchEngine, WriteOp
from cellsight.indexer.outcomes import Verdict
from cellsight.indexer.planning import EventInfo, Planned
from cellsight.indexer.writer import BatchWriter


def planned(position: int, doc_id: str, version: int, **fields: object) -> Planned:
    doc = {"uuid": doc_id, "display_name": f"v{version}", "version": version, **fields}
    info = EventInfo("instance.exists", datetime.now(UTC))
    return Planned(position, WriteOp("instance", doc_id, version, doc), info, None)


def test_a_tagless_document_takes_the_stored_tags(engine: SearchEngine) -> None:
    engine.ensure_ready("instance")
    tagged, untagged = str(uuid.uuid4()), str(uuid.uuid4())
    engine.bulk(
        [
            planned(0, tagged, 5, tags=["db", "prod"]).op,
            planned(0, untagged, 5).op,  # stored without tags: nothing to take
        ]
    )
    engine.refresh("instance")
    writer = BatchWriter(engine, record_metrics=False)
    batch = [planned(0, tagged, 6), planned(1, tagged, 4), planned(2, untagged, 6)]
    outcomes = writer.commit([None] * len(batch), batch)
    assert [o.verdict for o in outcomes] == [Verdict.INDEXED, Verdict.STALE, Verdict.INDEXED]
    engine.refresh("instance")
    stored = engine.get("instance", tagged)
    assert stored is not None and stored.version == 6
    assert stored.document["tags"] == ["db", "prod"]
    assert stored.document["display_name"] == "v6"
    other = engine.get("instance", untagged)
    assert other is not None and other.document["tags"] == []
