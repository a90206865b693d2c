"""The writer process (``cellsight.indexer.write_process``): what crosses the pipe comes
out exactly as it went in, whatever the document holds; a child that dies loses nothing
(its batches stay unacked and a next consumer indexes them); a child whose parent is gone
stops; a write blocked at shutdown is abandoned unacked; the parent's metrics count what
the child wrote. The consumer contract tests (poison, end to end, engine outage) run on
this pipeline too (``tests.support.indexing.PIPELINES``)."""

from __future__ import annotations

import logging
import math
import os
import signal
import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellsight.clients import build_bus
from cellsight.indexer.consumer import IndexerConsumer
from cellsight.indexer.engines.base import WriteOp
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.metrics import REGISTRY
from cellsight.indexer.outcomes import Outcome, Verdict
from cellsight.indexer.planning import EventInfo, Planned
from cellsight.indexer.write_child import _watch
from cellsight.indexer.write_process import WriteProcess, WriterProcessFailed, reopened
from cellsight.indexer.write_wire import (
    decode_outcome,
    decode_planned,
    encode_outcome,
    encode_planned,
    pack,
    unpack,
)
from cellsight.indexer.writer import BatchWriter
from cellsight.settings import Settings
from tests.indexer.test_poison_bus import publish
from tests.support import novagen, poison
from tests.support.indexing import bus_settings, running_indexer, started, wait_for

# JSON-like values at their extremes: integers past 64 bits, non-finite floats, lone
# surrogates, NUL, deep nesting, long strings.
leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(alphabet=st.characters(codec=None), max_size=40)
    | st.just("\ud800 lone")
    | st.just("x" * 100_000)
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def _same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN (the wire must carry it, not fix it)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _batch_through_the_pipe(planned: list[Planned]) -> tuple[bytes, list[Planned]]:
    frame = pack(("batch", 3, len(planned) + 1, [encode_planned(p) for p in planned]))
    kind, seq, size, wire = unpack(frame)
    assert (kind, seq, size) == ("batch", 3, len(planned) + 1)
    return frame, [decode_planned(w) for w in wire]


@settings(max_examples=200, deadline=None)
@given(
    document=st.dictionaries(st.text(max_size=12), values, max_size=8),
    version=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    # Naive too: msgpack writes a naive datetime as text, the typed decoder reads it back.
    stamp=st.none() | st.datetimes(timezones=st.just(UTC)) | st.datetimes(),
)
def test_a_planned_document_crosses_the_wire_unchanged(
    document: dict[str, Any], version: int, stamp: datetime | None
) -> None:
    planned = Planned(
        7,
        WriteOp("instance", "id-1", version, document),
        EventInfo("instance.update", stamp),
        stamp,
    )
    _, [back] = _batch_through_the_pipe([planned])
    assert back.position == 7 and back.snapshot_at == stamp
    assert type(back.snapshot_at) is type(stamp)
    assert back.notification == planned.notification
    assert (back.op.resource, back.op.id, back.op.version) == ("instance", "id-1", version)
    assert _same(back.op.document, document)


def test_a_batch_is_one_msgpack_frame_unless_a_document_needs_pickle() -> None:
    plain = [
        Planned(
            i, WriteOp("instance", f"id-{i}", i, {"n": i, "s": "x"}), EventInfo("e", None), None
        )
        for i in range(3)
    ]
    frame, back = _batch_through_the_pipe(plain)
    assert frame[:1] == b"b" and [b.op.document for b in back] == [p.op.document for p in plain]
    poisoned = [
        *plain,
        Planned(3, WriteOp("instance", "id-3", 3, {"n": 10**30}), EventInfo("e", None), None),
    ]
    frame, back = _batch_through_the_pipe(poisoned)
    assert frame[:1] == b"p" and back[3].op.document == {"n": 10**30}


@given(
    verdict=st.sampled_from(list(Verdict)),
    text=st.none() | st.text(alphabet=st.characters(codec=None), max_size=50),
    lag=st.none() | st.floats(min_value=0, max_value=1e9),
)
def test_a_verdict_crosses_the_wire_with_what_the_metrics_need(
    verdict: Verdict, text: str | None, lag: float | None
) -> None:
    outcome = Outcome(verdict, text, text, text, resource="instance", lag=lag)
    kind, seq, [(position, wire)] = unpack(pack(("done", 9, [(4, encode_outcome(outcome))])))
    back = decode_outcome(wire)
    assert (kind, seq, position) == ("done", 9, 4)
    assert back == outcome and back.resource == "instance" and back.lag == lag


def test_control_messages_cross_the_wire() -> None:
    for message in [("ready",), ("stop",), ("retry",), ("error", 5, "EngineError: \ud800")]:
        assert unpack(pack(message)) == message


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def _indexer(settings: Settings, engine: EmbeddedEngine) -> tuple[IndexerConsumer, Any]:
    bus = build_bus(settings)
    connection = bus.connection()
    from cellsight.clients import build_consumer_config

    consumer = IndexerConsumer(
        connection,
        engine,
        build_consumer_config(settings, batch_age=0.05, batch_count=20),
        write_process=reopened(engine),
    )
    return consumer, (bus, connection)


def test_a_killed_writer_process_loses_nothing(each_bus: Settings, tmp_path: Path) -> None:
    settings = each_bus
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    goods = [poison.good(seed=100 + i) for i in range(200)]
    uuids = [poison.data(g)["uuid"] for g in goods]
    consumer, (bus_, connection) = _indexer(settings, engine)
    child = consumer._flights.pid  # type: ignore[attr-defined]
    assert child is not None and child != os.getpid()
    # Held by the test: the child cannot commit, so the kill lands mid-write.
    lock = sqlite3.connect(tmp_path / "index.db", isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    thread, failure = started(consumer)
    publish(settings, [novagen.body(g) for g in goods])
    wait_for(lambda: consumer.received >= 20, what="a batch received")
    os.kill(child, signal.SIGKILL)
    thread.join(30)
    assert not thread.is_alive(), "the consumer did not stop when its writer died"
    assert failure and isinstance(failure[0], WriterProcessFailed), failure
    assert "exited" in str(failure[0])
    assert consumer.acked == 0
    connection.release()
    bus_.close()
    lock.execute("ROLLBACK")
    lock.close()
    # Nothing was acked, so the broker gives every message to the next consumer.
    with running_indexer(settings, engine, "process") as second:
        wait_for(lambda: second.acked >= len(goods), 60, "redelivered and written")
    assert second.totals["dead"] == 0
    assert all(engine.get("instance", u) is not None for u in uuids)
    engine.close()


def test_the_child_stops_when_its_parent_pipe_closes(tmp_path: Path) -> None:
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    pipeline = WriteProcess(reopened(engine), 1, BatchWriter(engine))
    proc = pipeline._proc
    assert proc.is_alive()
    pipeline._conn.close()  # as when the parent dies: the child reads end-of-file
    proc.join(20)
    assert not proc.is_alive(), "the writer process outlived its parent's pipe"
    pipeline._closed = True
    engine.close()


def test_a_stopped_writer_process_is_killed_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe: SIGTERM to an indexer whose writer process was SIGSTOPped (or wedged)
    waited forever: the child ignores SIGTERM, which was all ``close`` sent it."""
    from cellsight.indexer import write_process

    monkeypatch.setattr(write_process, "CLOSE_GRACE", 0.5)
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    pipeline = WriteProcess(reopened(engine), 1, BatchWriter(engine))
    proc = pipeline._proc
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGSTOP)
    closing = threading.Thread(target=pipeline.close, daemon=True)
    closing.start()
    closing.join(30)
    assert not closing.is_alive(), "close waited on a stopped writer process"
    assert not proc.is_alive() and proc.exitcode == -signal.SIGKILL
    engine.close()


def test_a_stopped_writer_process_is_told_in_the_log_and_a_gauge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A probe: a writer process stopped for 40 s left its indexer silent, its metrics
    endpoint (the health check) answering, nothing saying batches waited."""
    from cellsight.indexer import inflight

    monkeypatch.setattr(inflight, "STALL_WARN", 0.5)
    settings = bus_settings(tmp_path / "data", "embedded")
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    goods = [poison.good(seed=900 + i) for i in range(10)]
    with running_indexer(settings, engine, "process") as consumer:
        child = consumer._flights._proc.pid  # type: ignore[attr-defined]
        os.kill(child, signal.SIGSTOP)
        try:
            with caplog.at_level(logging.WARNING, logger="cellsight.indexer.inflight"):
                publish(settings, [novagen.body(g) for g in goods])
                wait_for(lambda: "the oldest batch in flight has waited" in caplog.text)
            assert _sample("cellsight_indexer_unsettled_seconds") >= 0.5
            assert consumer.acked == 0
        finally:
            os.kill(child, signal.SIGCONT)
        wait_for(lambda: consumer.acked >= len(goods), what="written once resumed")
        wait_for(lambda: _sample("cellsight_indexer_unsettled_seconds") == 0, what="gauge 0")
    engine.close()


class Flag:
    value = False


def test_the_child_stops_retrying_when_its_parent_changes_or_says_so() -> None:
    abort = threading.Event()
    watcher = threading.Thread(target=_watch, args=(Flag(), os.getpid(), abort, 0.01))
    watcher.start()  # our parent is not ourselves: the watcher sees a new parent
    watcher.join(5)
    assert abort.is_set() and not watcher.is_alive()
    flag, told = Flag(), threading.Event()
    steady = threading.Thread(target=_watch, args=(flag, os.getppid(), told, 0.01), daemon=True)
    steady.start()
    steady.join(0.2)
    assert not told.is_set() and steady.is_alive()  # same parent, no flag: keeps going
    flag.value = True
    steady.join(5)
    assert told.is_set() and not steady.is_alive()


def test_a_write_blocked_at_shutdown_stays_unacked_for_the_next_consumer(
    each_bus: Settings, tmp_path: Path
) -> None:
    settings = each_bus
    engine = EmbeddedEngine(tmp_path / "index.db", timeout=0.2)
    engine.ensure_ready("instance")
    goods = [poison.good(seed=300 + i) for i in range(30)]
    lock = sqlite3.connect(tmp_path / "index.db", isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # the engine is "down" for writes: retried, never done
    retries = _sample("cellsight_indexer_retries_total")
    publish(settings, [novagen.body(g) for g in goods])
    with running_indexer(settings, engine, "process", max_backoff=0.2) as consumer:
        wait_for(lambda: consumer.received >= len(goods), what="all received")
        # The child reports its retries: the parent's metrics see the outage.
        wait_for(lambda: _sample("cellsight_indexer_retries_total") > retries, what="retries")
    assert consumer.acked == 0
    lock.execute("ROLLBACK")
    lock.close()
    with running_indexer(settings, engine, "process") as second:
        wait_for(lambda: second.acked >= len(goods), 60, "redelivered and written")
    assert all(engine.get("instance", poison.data(g)["uuid"]) is not None for g in goods)
    engine.close()


def test_the_parent_counts_what_the_child_wrote(tmp_path: Path, rabbitmq_url: str) -> None:
    settings = bus_settings(tmp_path / "data", "rabbitmq")
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    # Oslo-wrapped notifications carry their timestamp: each one written is a lag sample.
    kinds = list(novagen.EVENT_CLASSES)
    goods = [novagen.notification(kinds[i % len(kinds)], seed=700 + i) for i in range(25)]
    for g in goods:
        g["timestamp"] = f"{datetime.now(UTC):%Y-%m-%d %H:%M:%S.%f}"  # Nova's form
    bad = b'{"not": "a notification"'
    before = {
        name: _sample(name)
        for name in (
            "cellsight_indexer_consumed_total",
            "cellsight_indexer_lag_seconds_count",
            "cellsight_indexer_engine_up",
        )
    }
    indexed = REGISTRY.get_sample_value("cellsight_indexer_indexed_total", {"resource": "instance"})
    publish(settings, [novagen.body(g) for g in goods] + [bad])
    with running_indexer(settings, engine, "process") as consumer:
        wait_for(lambda: consumer.acked >= len(goods) + 1, what="all settled")
    assert consumer.totals == {"indexed": 25, "stale": 0, "ignored": 0, "dead": 1}
    after = REGISTRY.get_sample_value("cellsight_indexer_indexed_total", {"resource": "instance"})
    assert (after or 0) - (indexed or 0) == 25
    assert (
        _sample("cellsight_indexer_consumed_total") - before["cellsight_indexer_consumed_total"]
        == 26
    )
    # Every written notification had a timestamp: one lag observation each.
    assert (
        _sample("cellsight_indexer_lag_seconds_count")
        - before["cellsight_indexer_lag_seconds_count"]
        == 25
    )
    assert _sample("cellsight_indexer_engine_up") == 1
    engine.close()


def test_an_unreadable_frame_ends_the_writer_and_fails_the_consumer(tmp_path: Path) -> None:
    """The child's receiver must not die alone, leaving its loop waiting forever."""
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    pipeline = WriteProcess(reopened(engine), 1, BatchWriter(engine))
    try:
        pipeline._conn.send_bytes(b"b\xc1 is never msgpack")
        pipeline._proc.join(30)
        assert pipeline._proc.exitcode is not None, "the writer process hung"
        with pytest.raises(WriterProcessFailed, match="writer process exited"):
            wait_for(lambda: pipeline.any_settled(), timeout=5, what="the failure")
    finally:
        pipeline.close()
        engine.close()
