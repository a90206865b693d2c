"""The fan-out under load and under saturation, with real cells and real threads.

* A cell's deadline starts when its query starts: with one worker, three cells whose
  queries each take most of a deadline all answer (queued ones are not "late").
* A saturated pool refuses with ``Saturated`` (503 + ``Retry-After``) after the bounded
  admission wait, never by reporting a healthy cell as down.
* A CI-sized run of ``scripts/load_fanout.py`` (concurrent clients over loopback) sees
  no response with a skipped cell.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cellsight.api.app import create_app
from cellsight.api.fanout import FanOut, Saturated
from cellsight.cells.mappings import CellMapping
from cellsight.indexer.engines.embedded import EmbeddedEngine
from scripts.load_fanout import run_load
from tests.support.api_world import World, api_settings
from tests.support.serve import serving


def test_the_deadline_starts_when_the_query_starts(sqlite_world: World) -> None:
    fanout = FanOut(cell_timeout=0.5, max_workers=1, admission_wait=5.0)
    cells = sqlite_world.registry.list_cells()
    assert len(cells) == 3

    def slow(cell: CellMapping, conn: Any) -> str:
        time.sleep(0.45)  # each within its own deadline; 1.35 s in all, queued
        return cell.uuid

    started = time.monotonic()
    result = fanout.map_cells(cells, slow)
    assert time.monotonic() - started > 1.2  # they did run one after another
    assert result.skipped == [] and set(result.results) == {c.uuid for c in cells}
    fanout.close()


def test_a_saturated_pool_refuses_with_retry_after(sqlite_world: World) -> None:
    fanout = FanOut(cell_timeout=2.0, max_workers=3, admission_wait=0.2)
    cells = sqlite_world.registry.list_cells()
    release = threading.Event()
    entered = threading.Barrier(4)

    def blocking(cell: CellMapping, conn: Any) -> None:
        entered.wait(5)
        release.wait(5)

    holder = threading.Thread(target=fanout.map_cells, args=(cells, blocking))
    holder.start()
    entered.wait(5)  # all three workers are busy
    with pytest.raises(Saturated) as refused:
        fanout.map_cells(cells, lambda cell, conn: None)
    assert refused.value.status == 503 and int(refused.value.headers["Retry-After"]) >= 1
    release.set()
    holder.join(5)
    again = fanout.map_cells(cells, lambda cell, conn: cell.name)
    assert again.skipped == [] and len(again.results) == 3
    fanout.close()


def test_concurrent_clients_never_see_a_healthy_cell_skipped(
    sqlite_world: World, tmp_path: Path
) -> None:
    engine = EmbeddedEngine(tmp_path / "empty.db", prefix="load")
    settings = api_settings(tmp_path, fanout_admission_wait=30.0)
    app = create_app(settings, engine=engine, registry=sqlite_world.registry)
    with serving(app) as base:
        figures = run_load(base, clients=12, seconds=3.0, limit=50)
    engine.close()
    assert figures["requests"] >= 12, figures
    assert figures["responses_with_skipped_cells"] == 0, figures
    assert set(figures["statuses"]) == {"200"}, figures
    assert figures["paths"] == {"fanout": figures["requests"]}, figures
