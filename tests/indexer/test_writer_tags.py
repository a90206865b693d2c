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


def _commit(writer: BatchWriter, *batch: Planned) -> list[Verdict]:
    return [o.verdict for o in writer.commit([None] * len(batch), list(batch))]


def _stored(engine: SearchEngine, doc_id: str) -> tuple[int, list[str], str]:
    engine.refresh("instance")
    stored = engine.get("instance", doc_id)
    assert stored is not None
    return stored.version, stored.document["tags"], stored.document["display_name"]


def test_an_older_event_with_tags_after_a_newer_tagless_one_sets_the_tags(
    engine: SearchEngine,
) -> None:
    """Nova's instance.update (tags) at v6, then power_off.end (no tags) at v8, arriving
    in the other order: the document is v8's, with v6's tags."""
    engine.ensure_ready("instance")
    doc_id = str(uuid.uuid4())
    writer = BatchWriter(engine, record_metrics=False)
    assert _commit(writer, planned(0, doc_id, 5, tags=["old"], tags_version=5)) == [Verdict.INDEXED]
    assert _commit(writer, planned(0, doc_id, 8)) == [Verdict.INDEXED]
    assert _stored(engine, doc_id) == (8, ["old"], "v8")
    assert _commit(writer, planned(0, doc_id, 6, tags=["new"], tags_version=6)) == [Verdict.STALE]
    assert _stored(engine, doc_id) == (8, ["new"], "v8")
    # Newer tags still win, and an older event's tags, redelivered, no longer do.
    _commit(writer, planned(0, doc_id, 7, tags=["newer"], tags_version=7))
    _commit(writer, planned(0, doc_id, 6, tags=["new"], tags_version=6))
    assert _stored(engine, doc_id) == (8, ["newer"], "v8")
    # A newer event with tags replaces the whole document as before.
    _commit(writer, planned(0, doc_id, 9, tags=["last"], tags_version=9))
    _commit(writer, planned(0, doc_id, 7, tags=["newer"], tags_version=7))
    assert _stored(engine, doc_id) == (9, ["last"], "v9")


def test_tags_unknown_at_the_first_event_come_from_any_older_event(engine: SearchEngine) -> None:
    engine.ensure_ready("instance")
    doc_id = str(uuid.uuid4())
    writer = BatchWriter(engine, record_metrics=False)
    _commit(writer, planned(0, doc_id, 8))
    assert _stored(engine, doc_id) == (8, [], "v8")
    # In one batch: the older tagged events are stale, the newest of them counts.
    verdicts = _commit(
        writer,
        planned(0, doc_id, 3, tags=["c3"], tags_version=3),
        planned(1, doc_id, 5, tags=["c5"], tags_version=5),
        planned(2, doc_id, 4, tags=["c4"], tags_version=4),
    )
    assert verdicts == [Verdict.STALE] * 3
    assert _stored(engine, doc_id) == (8, ["c5"], "v8")


def test_a_document_without_tags_version_has_tags_as_new_as_itself(
    engine: SearchEngine,
) -> None:
    """Documents written before ``tags_version`` existed: an older event's tags do not
    replace theirs."""
    engine.ensure_ready("instance")
    doc_id = str(uuid.uuid4())
    engine.bulk([planned(0, doc_id, 8, tags=["kept"]).op])
    writer = BatchWriter(engine, record_metrics=False)
    assert _commit(writer, planned(0, doc_id, 6, tags=["older"], tags_version=6)) == [Verdict.STALE]
    assert _stored(engine, doc_id) == (8, ["kept"], "v8")
