"""The tags rewrite of stale events (``cellsight.indexer.retag``) against what happens
around it: a second writer retagging the same instance (``--workers N``), a purge between
its read and its write, an engine asking to retry, a sync's second write index, and the
reads it costs. Interleavings are made by pausing a real engine's read at a chosen
moment; the 429 is a real engine's answer replaced, as the embedded engine has none."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cellsight.indexer.engines.base import (
    SearchEngine,
    StoredDocument,
    WriteOp,
    WriteResult,
    WriteStatus,
)
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.outcomes import Verdict
from cellsight.indexer.planning import EventInfo, Planned
from cellsight.indexer.writer import BatchWriter


def planned(doc_id: str, version: int, tags: list[str] | None = None, position: int = 0) -> Planned:
    doc: dict[str, Any] = {"uuid": doc_id, "display_name": f"v{version}", "version": version}
    if tags is not None:
        doc.update(tags=tags, tags_version=version)
    info = EventInfo("instance.update", datetime.now(UTC))
    return Planned(position, WriteOp("instance", doc_id, version, doc), info, None)


def commit(writer: BatchWriter, p: Planned) -> Verdict:
    [outcome] = writer.commit([None], [p])
    return outcome.verdict


def writer(engine: SearchEngine) -> BatchWriter:
    return BatchWriter(engine, record_metrics=False, max_backoff=0.01)


def tags_of(engine: SearchEngine, doc_id: str) -> tuple[int, list[str], Any]:
    engine.refresh("instance")
    stored = engine.get("instance", doc_id)
    assert stored is not None
    return stored.version, stored.document["tags"], stored.document.get("tags_version")


def v10_with_tags_of_v2(engine: SearchEngine) -> str:
    """A document at v10 whose tags came from v2 (a tag-less event followed a tagged one)."""
    engine.ensure_ready("instance")
    doc_id = str(uuid.uuid4())
    w = writer(engine)
    commit(w, planned(doc_id, 2, ["t2"]))
    commit(w, planned(doc_id, 10))
    assert tags_of(engine, doc_id) == (10, ["t2"], 2)
    return doc_id


class PausingEngine(EmbeddedEngine):
    """The embedded engine, whose whole-document reads can run a hook first."""

    before_full_read: Callable[[], object] | None = None

    def get_many(
        self,
        resource: str,
        ids: Sequence[str],
        *,
        fields: Sequence[str] | None = None,
        index: str | None = None,
    ) -> dict[str, StoredDocument]:
        found = super().get_many(resource, ids, fields=fields, index=index)
        if fields is None and self.before_full_read is not None:
            hook, self.before_full_read = self.before_full_read, None
            hook()
        return found


def test_two_writers_retagging_at_once_keep_the_newer_tags(tmp_path: Path) -> None:
    """Writer A holds a stale v5 with tags, writer B a stale v7: A reads, B retags, then
    A writes. The embedded engine takes a same-version write only while the stored tags
    are older, so A's older tags lose."""
    engine = PausingEngine(tmp_path / "index.db")
    doc_id = v10_with_tags_of_v2(engine)
    other = EmbeddedEngine(tmp_path / "index.db")  # another worker's writer process
    engine.before_full_read = lambda: commit(writer(other), planned(doc_id, 7, ["t7"]))
    assert commit(writer(engine), planned(doc_id, 5, ["t5"])) is Verdict.STALE
    assert tags_of(engine, doc_id) == (10, ["t7"], 7)
    other.close()
    engine.close()


def test_a_retag_never_recreates_a_document_purged_meanwhile(tmp_path: Path) -> None:
    engine = PausingEngine(tmp_path / "index.db")
    doc_id = v10_with_tags_of_v2(engine)
    engine.before_full_read = lambda: engine.delete("instance", [doc_id])
    assert commit(writer(engine), planned(doc_id, 6, ["t6"])) is Verdict.STALE
    assert engine.get("instance", doc_id) is None
    engine.close()


class BusyOnce(EmbeddedEngine):
    """The embedded engine answering its first same-version writes as an overloaded
    cluster does (429: retry the item)."""

    refusals = 3

    def bulk(self, ops: Sequence[WriteOp]) -> list[WriteResult]:
        if self.refusals and any(op.same_version for op in ops):
            self.refusals -= 1
            return [WriteResult(WriteStatus.RETRY, "429 Too Many Requests") for _ in ops]
        return super().bulk(ops)


def test_a_retag_the_engine_asks_to_retry_is_retried_until_written(tmp_path: Path) -> None:
    engine = BusyOnce(tmp_path / "index.db")
    doc_id = v10_with_tags_of_v2(engine)
    retries: list[int] = []
    w = BatchWriter(
        engine, record_metrics=False, max_backoff=0.01, on_retry=lambda: retries.append(1)
    )
    assert commit(w, planned(doc_id, 6, ["t6"])) is Verdict.STALE
    assert engine.refusals == 0 and len(retries) == 3  # each refusal waited out a backoff
    assert tags_of(engine, doc_id) == (10, ["t6"], 6)
    engine.close()


class CountingReads(EmbeddedEngine):
    reads = 0

    def get_many(
        self,
        resource: str,
        ids: Sequence[str],
        *,
        fields: Sequence[str] | None = None,
        index: str | None = None,
    ) -> dict[str, StoredDocument]:
        self.reads += 1
        return super().get_many(resource, ids, fields=fields, index=index)


def test_duplicates_of_events_with_tags_cost_no_read_on_the_embedded_engine(
    tmp_path: Path,
) -> None:
    """Cellsight's producer sends tags on every event: a redelivered one is stale with
    tags as new as the stored ones, which the embedded engine's answer says."""
    engine = CountingReads(tmp_path / "index.db")
    engine.ensure_ready("instance")
    w = writer(engine)
    ids = [str(uuid.uuid4()) for _ in range(20)]
    batch = [planned(i, 3, ["a"], n) for n, i in enumerate(ids)]
    w.commit([None] * len(batch), batch)
    before = engine.reads
    again = [planned(i, 3 - n // 20, ["a" if n < 20 else "old"], n) for n, i in enumerate(ids * 2)]
    outcomes = w.commit([None] * len(again), again)
    assert {o.verdict for o in outcomes} == {Verdict.STALE}
    assert engine.reads == before
    engine.close()


def test_a_tagless_event_during_a_sync_keeps_the_served_tags(engine: SearchEngine) -> None:
    """A sync's new index is behind the write alias and has not loaded the instance yet:
    the tags a tag-less event keeps are the served index's, not none."""
    doc_id = v10_with_tags_of_v2(engine)
    (live,) = engine.indexes("instance")
    new = engine.new_index_name("instance")
    engine.create_index("instance", new, bulk_load=True)
    engine.set_aliases("instance", read=live.name, write=[live.name, new])
    assert commit(writer(engine), planned(doc_id, 12)) is Verdict.INDEXED
    assert tags_of(engine, doc_id) == (12, ["t2"], 2)


def test_a_stale_event_whose_tags_are_older_reads_no_whole_document(
    engine: SearchEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded engine's answer says the stored tags are newer; the HTTP engines read
    the stored tags version alone. Neither reads the whole document."""
    engine.ensure_ready("instance")
    doc_id = str(uuid.uuid4())
    doc = {"uuid": doc_id, "version": 9, "tags": ["kept"], "tags_version": 7}
    engine.bulk([WriteOp("instance", doc_id, 9, doc)])
    whole: list[Sequence[str]] = []
    real = engine.get_many

    def get_many(
        resource: str, ids: Sequence[str], *, fields: Sequence[str] | None = None
    ) -> dict[str, StoredDocument]:
        if fields is None:
            whole.append(ids)
        return real(resource, ids, fields=fields)

    monkeypatch.setattr(engine, "get_many", get_many)
    assert commit(writer(engine), planned(doc_id, 6, ["t6"])) is Verdict.STALE
    assert whole == []
    assert tags_of(engine, doc_id) == (9, ["kept"], 7)


def test_tags_stored_between_a_tagless_event_s_read_and_its_write_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe (``--workers 2``, Nova's payloads shuffled): a tag-less event's worker read
    the stored tags (v5's), another worker then stored v7 with new tags, and the tag-less
    v8 went on with v5's. The embedded engine decides it under its write lock."""
    path = tmp_path / "index.db"
    engine, other = EmbeddedEngine(path), EmbeddedEngine(path)  # two workers' engines
    engine.ensure_ready("instance")
    doc_id = str(uuid.uuid4())
    commit(writer(engine), planned(doc_id, 5, ["t5"]))
    read = engine.get_many

    def read_then_other_writes(*args: Any, **kwargs: Any) -> dict[str, StoredDocument]:
        found = read(*args, **kwargs)
        assert commit(writer(other), planned(doc_id, 7, ["t7"])) is Verdict.INDEXED
        return found

    monkeypatch.setattr(engine, "get_many", read_then_other_writes)
    assert commit(writer(engine), planned(doc_id, 8)) is Verdict.INDEXED
    assert tags_of(engine, doc_id) == (8, ["t7"], 7)
    other.close()
    engine.close()
