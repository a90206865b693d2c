"""The writer's retry of a transient engine failure says which step failed and why, in
one line (tenacity's own line named the function: ``Retrying <unknown>`` for a lambda)."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from tenacity import RetryCallState, Retrying

from cellsight.indexer.engines.base import EngineTimeout, EngineUnavailable, WriteOp
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.outcomes import Verdict
from cellsight.indexer.planning import EventInfo, Planned
from cellsight.indexer.writer import TIMEOUT_PAUSE, BatchWriter, retry_wait


def test_a_busy_index_is_retried_with_a_line_naming_the_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = EmbeddedEngine(tmp_path / "index.db", timeout=0.05)
    holder = sqlite3.connect(tmp_path / "index.db", isolation_level=None)

    def release() -> None:  # at the first retry: the outage ends
        if holder.in_transaction:
            holder.execute("ROLLBACK")

    writer = BatchWriter(engine, record_metrics=False, max_backoff=0.01, on_retry=release)
    info = EventInfo("instance.update", datetime.now(UTC))

    def planned() -> Planned:
        doc_id = str(uuid.uuid4())
        doc = {"uuid": doc_id, "version": 1, "tags": [], "tags_version": 1}
        return Planned(0, WriteOp("instance", doc_id, 1, doc), info, None)

    writer.commit([None], [planned()])  # the indexes made ready: the next step is the write
    holder.execute("BEGIN IMMEDIATE")  # a real busy database: the bulk write must wait
    with caplog.at_level(logging.WARNING, logger="cellsight.indexer.writer"):
        [outcome] = writer.commit([None], [planned()])
    holder.close()
    engine.close()
    assert outcome.verdict is Verdict.INDEXED
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        line.startswith("the bulk write failed (EngineUnavailable: ") and "retrying in" in line
        for line in lines
    ), lines
    assert not any("<unknown>" in line for line in lines), lines


def _failed(exc: BaseException, attempt: int) -> RetryCallState:
    state = RetryCallState(Retrying(), None, (), {})
    state.attempt_number = attempt
    state.set_exception((type(exc), exc, None))
    return state


def test_a_timed_out_request_is_not_sent_again_at_once() -> None:
    """A probe: beside a busy peer, each write in flight that timed out was sent again
    after the jitter alone, often 0.0 s, and kept the peer past its timeout."""
    wait = retry_wait(max_backoff=30.0)
    for attempt in (1, 2, 3):
        assert wait(_failed(EngineTimeout("read timed out"), attempt)) >= TIMEOUT_PAUSE
    # Other transient failures keep the short jittered backoff (a busy SQLite file).
    busy = [wait(_failed(EngineUnavailable("database is locked"), 1)) for _ in range(50)]
    assert max(busy) <= 0.1
    # Never past the backoff's bound, which tests and operators set low.
    assert retry_wait(max_backoff=0.2)(_failed(EngineTimeout("read timed out"), 1)) <= 0.2


def test_commits_in_flight_make_missing_indexes_once(tmp_path: Path) -> None:
    """A probe: after a wipe, each commit in flight made its own indexes (all but the
    oldest dropped again, one under a bulk under way left behind unaliased)."""
    engine = EmbeddedEngine(tmp_path / "index.db")
    made: list[str] = []
    ensure = engine.ensure_ready

    def slow_ensure(resource: str) -> None:
        made.append(resource)
        time.sleep(0.2)  # an engine making an index: the other commits arrive meanwhile
        ensure(resource)

    engine.ensure_ready = slow_ensure  # type: ignore[method-assign]
    writer = BatchWriter(engine, record_metrics=False, max_backoff=0.01)
    info = EventInfo("instance.update", datetime.now(UTC))
    outcomes: list[Verdict] = []

    def commit() -> None:
        doc_id = str(uuid.uuid4())
        doc = {"uuid": doc_id, "version": 1, "tags": [], "tags_version": 1}
        [outcome] = writer.commit(
            [None], [Planned(0, WriteOp("instance", doc_id, 1, doc), info, None)]
        )
        outcomes.append(outcome.verdict)

    threads = [threading.Thread(target=commit) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    engine.close()
    assert outcomes == [Verdict.INDEXED] * 5
    assert made == ["instance"]
