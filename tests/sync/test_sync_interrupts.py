"""An interrupted sync says what serves, and its clean-up is not cut short by a second
interrupt."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from cellsight.indexer.index_roles import marker_key
from cellsight.indexer.lock import MaintenanceLock
from cellsight.indexer.sync import SyncInterrupted, SyncOptions, run_sync
from tests.sync.test_sync_failures import AfterBatches, World, _ctrl_c, _serving


@pytest.mark.parametrize("where", ["set_aliases", "holds"])
def test_a_second_interrupt_waits_for_the_clean_up(
    make_world: Any, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """An interrupt probe: a second SIGTERM (a service manager's, after the first) during
    the clean-up of an interrupted sync stopped it half-way: the half-built index kept
    the write alias (the indexer wrote into it) while the sync said "nothing changed".
    A review: also as the clean-up asks whether the lock is still held."""
    world: World = make_world("sqlite", "embedded")
    run_sync(world.engine, world.registry, SyncOptions())
    before = _serving(world)
    engine = world.engine
    owner = engine if where == "set_aliases" else MaintenanceLock
    step = getattr(owner, where)
    interrupted: list[bool] = []

    def first_interrupt() -> None:
        interrupted.append(True)
        _ctrl_c()

    def signalled_again(*args: Any, **kwargs: Any) -> Any:
        if interrupted:  # the clean-up's (the lock is asked of before the load too)
            os.kill(os.getpid(), signal.SIGINT)  # its handler runs as this returns
        return step(*args, **kwargs)

    monkeypatch.setattr(owner, where, signalled_again)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(
            SyncInterrupted, match=r"interrupted\. .* still serves and .* was deleted"
        ):
            run_sync(engine, world.registry, SyncOptions(batch_size=3),
                     progress=AfterBatches(3, first_interrupt))  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
        monkeypatch.undo()
    assert _serving(world) == before  # the aliases back, no half-built index left
    world.assert_index_equals_cells()


@pytest.mark.parametrize(
    ("point", "says"),
    [("marker", "began to serve, before its synced marker"), ("retire", "after it completed")],
)
def test_an_interrupt_past_the_swap_says_what_serves(
    make_world: Any, monkeypatch: pytest.MonkeyPatch, point: str, says: str
) -> None:
    world: World = make_world("sqlite", "embedded")
    run_sync(world.engine, world.registry, SyncOptions())
    old, _, _ = _serving(world)
    engine = world.engine
    name = "put_meta" if point == "marker" else "drop_index"
    original = getattr(engine, name)

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        if point == "marker" and args[0] != marker_key("instance"):
            return original(*args, **kwargs)  # the lock's own stamps
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, name, interrupted)
    with pytest.raises(SyncInterrupted, match=says):
        run_sync(engine, world.registry, SyncOptions(keep_old=0))
    monkeypatch.undo()
    new, writers, _ = _serving(world)
    assert new != old and writers == [new]  # the new index serves: something did change
    world.assert_index_equals_cells()
