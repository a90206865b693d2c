"""The writer's retry of a transient engine failure says which step failed and why, in
one line (tenacity's own line named the function: ``Retrying <unknown>`` for a lambda)."""

from __future__ import annotations

import logging
import sqlite3
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cellsight.indexer.engines.base import WriteOp
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.outcomes import Verdict
from cellsight.indexer.planning import EventInfo, Planned
from cellsight.indexer.writer import BatchWriter


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
