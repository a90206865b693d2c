"""An interrupt (Ctrl-C, or SIGTERM as one-shot commands raise it) that lands in the
embedded search's ``REGEXP`` function stays an interrupt: sqlite3 drops what a function
raises and says "user-defined function raised exception", which the search then took
for an engine error (``cellsight.sqlite_interrupts``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cellsight.indexer.engines.base import WriteOp, WriteStatus
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.query import sqlite_regexp
from cellsight.query.tree import Regex, SearchRequest, SortKey


def test_an_interrupt_in_the_regexp_function_is_given_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = EmbeddedEngine(tmp_path / "index.db", prefix="t")
    try:
        engine.ensure_ready("instance")
        ops = [
            WriteOp("instance", f"{i:05}", 1, {"uuid": f"{i:05}", "version": 1,
                    "display_name": f"n{i:05}", "deleted": False})
            for i in range(200)
        ]  # fmt: skip
        written = engine.bulk_index(engine.indexes("instance")[0].name, iter(ops))
        assert all(r.status is WriteStatus.OK for r in written)
        request = SearchRequest(Regex("display_name", "7$"), (SortKey("display_name"),), 500)
        real = sqlite_regexp.matcher

        def interrupted_at_the_100th(pattern: str) -> Callable[..., Any]:
            match = real(pattern)

            def matching(value: str, check: Callable[[], None]) -> Any:
                if value == "n00100":  # where a signal's handler ran, mid-statement
                    raise KeyboardInterrupt
                return match(value, check)

            return matching

        monkeypatch.setattr(sqlite_regexp, "matcher", interrupted_at_the_100th)
        with pytest.raises(KeyboardInterrupt):
            engine.search("instance", request)
        monkeypatch.undo()
        found = [hit.document["display_name"] for hit in engine.search("instance", request)]
        assert found == [f"n{i:05}" for i in range(200) if i % 10 == 7]
    finally:
        engine.close()
