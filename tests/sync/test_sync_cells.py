"""``index sync --cell``: only that cell's documents change; no new index, no new marker."""

from __future__ import annotations

from typing import Any

from cellsight.indexer.index_roles import is_synced, layout, marker_key
from cellsight.indexer.sync import SyncOptions, run_sync
from tests.support.sync_world import World


def _by_cell(docs: dict[str, dict[str, Any]], cell_uuid: str) -> dict[str, dict[str, Any]]:
    return {u: d for u, d in docs.items() if d["cell_uuid"] == cell_uuid}


def test_syncing_cells_updates_only_their_documents(world: World) -> None:
    engine = world.engine
    run_sync(engine, world.registry, SyncOptions())
    serving = layout(engine, "instance").serving
    marker = engine.get_meta(marker_key("instance"))
    one, other = world.cells
    # Both cells change behind the notifications' back.
    for cell in (one, other):
        world.bump(cell, list(world.revisions(cell))[:5], display_name="changed")
    before = world.documents()
    report = run_sync(engine, world.registry, SyncOptions(cells=[one.name], batch_size=4))
    assert report.mode == "cells" and [c["name"] for c in report.cells] == [one.name]
    (tally,) = report.cells
    assert tally["written"] == 5 and tally["stale"] == tally["rows"] - 5
    after, rows = world.documents(), world.rows()
    assert _by_cell(after, one.uuid) == _by_cell(rows, one.uuid)  # caught up
    assert _by_cell(after, other.uuid) == _by_cell(before, other.uuid)  # untouched
    assert _by_cell(after, other.uuid) != _by_cell(rows, other.uuid)  # (still stale)
    assert layout(engine, "instance").serving == serving  # no new index
    assert engine.get_meta(marker_key("instance")) == marker
    assert is_synced(engine, "instance")

    # A cell added later is backfilled the same way, leaving the others alone.
    (added,) = world.add_cells(1, instances=12)
    report = run_sync(engine, world.registry, SyncOptions(cells=[added.uuid]))
    assert report.cells[0]["written"] == 12
    final, rows = world.documents(), world.rows()
    assert _by_cell(final, added.uuid) == _by_cell(rows, added.uuid)
    assert {u: d for u, d in final.items() if d["cell_uuid"] != added.uuid} == after


class _Phases:
    def __init__(self) -> None:
        self.said: list[str] = []

    def phase(self, text: str) -> None:
        self.said.append(text)

    def start_cells(self, cells: Any) -> None:
        pass

    def advance(self, cell_uuid: str, n: int) -> None:
        pass


def test_the_progress_counts_cells_in_words(make_world: Any) -> None:
    """It said "loading 4 instance rows from 1 cells" (a reread)."""
    world: World = make_world("sqlite", "embedded", cells=1, instances=4)
    progress = _Phases()
    run_sync(world.engine, world.registry, SyncOptions(), progress=progress)
    assert "loading 4 instance rows from 1 cell" in progress.said
    world.add_cells(1, instances=3)
    run_sync(world.engine, world.registry, SyncOptions(), progress=progress)
    assert "loading 7 instance rows from 2 cells" in progress.said
