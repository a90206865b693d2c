"""The maintenance lock: one sync or verify per resource type, on every engine."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cellsight.indexer.engines.base import EngineUnavailable, SearchEngine
from cellsight.indexer.lock import LockHeld, LockLost, MaintenanceLock, lock_key
from cellsight.indexer.sync import SyncFailed, SyncOptions, run_sync
from tests.support.sync_world import make_engine
from tests.support.waiting import wait_for


@pytest.fixture
def engine(request: pytest.FixtureRequest, engine_kind: str, tmp_path: Path) -> Any:
    eng = make_engine(request, engine_kind, tmp_path / "index.db")
    yield eng
    eng.close()


def test_swap_meta_is_compare_and_set(engine: SearchEngine) -> None:
    assert engine.swap_meta("k", None, {"v": 1})
    assert not engine.swap_meta("k", None, {"v": 2})  # exists already
    assert not engine.swap_meta("k", {"v": 0}, {"v": 2})  # not what it holds
    assert engine.swap_meta("k", {"v": 1}, {"v": 2})
    assert engine.get_meta("k") == {"v": 2}


def test_only_one_of_racing_acquirers_wins(engine: SearchEngine) -> None:
    wins, held = [], []
    start = threading.Barrier(4)

    def race() -> None:
        lock = MaintenanceLock(engine, "instance", "sync")
        start.wait()
        try:
            lock.acquire()
            wins.append(lock)
        except LockHeld:
            held.append(lock)

    threads = [threading.Thread(target=race) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(wins) == 1 and len(held) == 3
    wins[0].release()
    with MaintenanceLock(engine, "instance", "verify"):  # free again
        pass


def test_second_sync_gets_a_clear_error(engine: SearchEngine) -> None:
    with MaintenanceLock(engine, "instance", "sync"), pytest.raises(LockHeld) as held:
        run_sync(engine, None, SyncOptions())  # type: ignore[arg-type]
    message = str(held.value)
    assert "another instance sync, verify or purge is running" in message
    assert f"{socket.gethostname()}:{os.getpid()}" in message
    with MaintenanceLock(engine, "node", "sync"):  # another resource type: independent
        pass


def _foreign(engine: SearchEngine, *, pid: int, expires_in: float) -> None:
    now = datetime.now(UTC)
    value = {
        "owner": "someone", "purpose": "sync", "host": socket.gethostname(), "pid": pid,
        "acquired_at": now.isoformat(), "heartbeat_at": now.isoformat(),
        "expires_at": (now + timedelta(seconds=expires_in)).isoformat(),
    }  # fmt: skip
    assert engine.swap_meta(lock_key("instance"), engine.get_meta(lock_key("instance")), value)


def test_stale_locks_are_taken_over(engine: SearchEngine, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="cellsight.indexer.lock")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _foreign(engine, pid=dead.pid, expires_in=600)  # its owner died on this host
    with MaintenanceLock(engine, "instance", "sync"):
        pass
    # A sync probe: "stale after" a time still to come, and nothing else, read as not stale.
    (gone,) = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
    assert gone.endswith("; its process is gone"), gone
    caplog.clear()
    _foreign(engine, pid=os.getppid(), expires_in=-1)  # alive, but stopped renewing
    with MaintenanceLock(engine, "instance", "sync"):
        pass
    (expired,) = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
    assert "process is gone" not in expired, expired
    _foreign(engine, pid=os.getppid(), expires_in=600)  # alive and renewing
    with pytest.raises(LockHeld), MaintenanceLock(engine, "instance", "sync"):
        pass


def test_a_lost_lock_stops_its_holder(engine: SearchEngine) -> None:
    lock = MaintenanceLock(engine, "instance", "sync", ttl=2, heartbeat=0.1)
    lock.acquire()
    first = engine.get_meta(lock_key("instance"))
    assert first is not None
    wait_for(lambda: engine.get_meta(lock_key("instance")) != first, timeout=10, what="a heartbeat")
    renewed = engine.get_meta(lock_key("instance"))
    assert renewed is not None and renewed["heartbeat_at"] > first["heartbeat_at"]
    lock.check()  # renewing fine
    _foreign(engine, pid=os.getppid(), expires_in=600)  # someone took it over
    deadline = time.monotonic() + 10
    with pytest.raises(LockLost, match="was lost"):
        while time.monotonic() < deadline:
            lock.check()
            time.sleep(0.05)
    lock.release()  # does not release the other owner's lock
    assert engine.get_meta(lock_key("instance"))["owner"] == "someone"  # type: ignore[index]


def test_a_lock_released_by_the_one_that_took_it_over_is_described(engine: SearchEngine) -> None:
    """An adversarial probe: a sync stopped past its lock's expiry, while a second sync
    took the lock over and finished, said it was taken over by "a sync by None:None
    since None"."""
    from cellsight.indexer.lock import describe

    lock = MaintenanceLock(engine, "instance", "verify")
    lock.acquire()
    lock.release()
    released = engine.get_meta(lock_key("instance"))
    assert released is not None and released["released"]
    me = f"{socket.gethostname()}:{os.getpid()}"
    assert describe(released) == f"a verify by {me}, which released it at {released['at']}"


def test_a_holder_paused_past_a_takeover_finds_its_lock_lost_at_once(
    engine: SearchEngine,
) -> None:
    """An adversarial probe: a sync stopped (SIGSTOP) past its lock's expiry resumed
    before its heartbeat noticed the takeover, and went on changing aliases. Its checks
    now ask the engine, not only the heartbeat's flag."""
    lock = MaintenanceLock(engine, "instance", "sync", heartbeat=600)  # never beats here
    lock.acquire()
    _foreign(engine, pid=os.getppid(), expires_in=600)  # taken over while it was stopped
    assert not lock.holds()
    with pytest.raises(LockLost, match="taken over: a sync by"):
        lock.check()
    lock.release()
    assert engine.get_meta(lock_key("instance"))["owner"] == "someone"  # type: ignore[index]


def test_a_sync_failing_after_its_lock_was_taken_over_leaves_the_aliases_alone(
    make_world: Any, engine_kind: str
) -> None:
    """An adversarial probe: a full sync paused past its lock's expiry while a second
    one took the lock over and dropped its index; resumed, it failed on the missing
    index and put back the aliases it had started from, cutting the second sync's index
    out of the write alias mid-load (or, later, undoing its swap)."""
    from cellsight.indexer.engines.base import EngineRejected
    from cellsight.indexer.index_roles import layout

    world = make_world("sqlite", engine_kind)
    engine = world.engine
    run_sync(engine, world.registry, SyncOptions(keep_old=0))
    serving = layout(engine, "instance").serving
    assert serving is not None
    theirs = f"{engine.prefix}-instance-29991231235959000000"
    finish = engine.finish_bulk_load

    def taken_over_then_failing(index: str) -> None:
        # The other sync: the lock, its own index beside the serving one, A's gone.
        _foreign(engine, pid=os.getppid(), expires_in=600)
        engine.create_index("instance", theirs, bulk_load=True)
        engine.set_aliases("instance", read=serving.name, write=[serving.name, theirs])
        engine.drop_index(index)
        raise EngineRejected(f"index {index} does not exist")

    engine.finish_bulk_load = taken_over_then_failing
    with pytest.raises(SyncFailed, match="lock was lost"):
        run_sync(engine, world.registry, SyncOptions())
    engine.finish_bulk_load = finish
    after = layout(engine, "instance")
    assert after.serving is not None and after.serving.name == serving.name
    assert sorted(after.writers) == sorted([serving.name, theirs])  # as the other left them


def test_a_sync_whose_engine_lost_its_lock_record_does_not_blame_a_taker(
    make_world: Any, engine_kind: str
) -> None:
    """A sync probe: osmem restarted empty under a sync, which failed saying "the
    aliases are as the one that took it over left them": nobody had taken it over."""
    from cellsight.indexer.engines.base import EngineUnavailable

    world = make_world("sqlite", engine_kind)
    engine = world.engine

    def forgotten_then_failing(index: str) -> None:
        _forget_meta(engine, lock_key("instance"))
        raise EngineUnavailable("connection refused (the engine restarting)")

    engine.finish_bulk_load = forgotten_then_failing
    with pytest.raises(SyncFailed) as failed:
        run_sync(engine, world.registry, SyncOptions())
    said = str(failed.value)  # the failure retried, then the lock's check said why
    assert "the engine no longer holds its record" in said, said
    assert "the aliases are as the engine holds them" in said, said
    assert "took it over" not in said, said


class AnswerLost:
    """The engine, but the answer to one ``swap_meta`` never arrives: the write is
    applied and the call fails as a timed-out request does (an adversarial probe held
    a renewal's reply past ``search_timeout`` with a proxy in front of OpenSearch)."""

    def __init__(self, engine: SearchEngine) -> None:
        self._engine = engine
        self.lose_next = threading.Event()
        self.lost = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def swap_meta(self, key: str, expected: Any, new: Any) -> bool:
        done = self._engine.swap_meta(key, expected, new)
        if self.lose_next.is_set():
            self.lose_next.clear()
            self.lost.set()
            raise EngineUnavailable("the request timed out (its answer was lost)")
        return done


def test_a_renewal_whose_answer_was_lost_keeps_the_lock(engine: SearchEngine) -> None:
    """The renewal after it compared with the value known before it, found the stored
    one different, and the sync declared its lock "taken over" by itself."""
    lossy = AnswerLost(engine)
    lock = MaintenanceLock(lossy, "instance", "sync", ttl=30, heartbeat=0.05)  # type: ignore[arg-type]
    lock.acquire()
    lossy.lose_next.set()
    wait_for(lossy.lost.is_set, timeout=10, what="a renewal whose answer is lost")
    applied = engine.get_meta(lock_key("instance"))
    assert applied is not None
    wait_for(
        lambda: engine.get_meta(lock_key("instance"))["heartbeat_at"] > applied["heartbeat_at"],  # type: ignore[index]
        timeout=10,
        what="a renewal after the lost answer",
    )
    lock.check(fresh=True)
    lock.release()
    released = engine.get_meta(lock_key("instance"))
    assert released is not None and released["released"] and released["owner"] == lock.owner


def test_a_release_after_a_lost_answer_releases(engine: SearchEngine) -> None:
    lossy = AnswerLost(engine)
    lock = MaintenanceLock(lossy, "instance", "verify", heartbeat=0.05)  # type: ignore[arg-type]
    lock.acquire()
    lossy.lose_next.set()
    wait_for(lossy.lost.is_set, timeout=10, what="a renewal whose answer is lost")
    lock.release()  # before any renewal learnt what the engine holds
    released = engine.get_meta(lock_key("instance"))
    assert released is not None and released["released"], released
    with MaintenanceLock(engine, "instance", "sync"):  # free at once, not after the expiry
        pass


def test_a_lock_whose_record_the_engine_lost_says_so(engine: SearchEngine) -> None:
    """A probe: osmem restarted empty under a sync, which then said its lock was "not
    renewed within 60s and taken over: nobody", where no minute had passed."""
    lock = MaintenanceLock(engine, "instance", "sync")
    lock.acquire()
    try:
        _forget_meta(engine, lock_key("instance"))
        with pytest.raises(LockLost, match="the engine no longer holds its record"):
            lock.check(fresh=True)
    finally:
        lock.release()


def _forget_meta(engine: SearchEngine, key: str) -> None:
    """The record gone, as from an engine that lost its data."""
    from cellsight.indexer.engines.embedded import EmbeddedEngine

    if isinstance(engine, EmbeddedEngine):
        with engine._conn() as conn:
            conn.execute("DELETE FROM _cs_meta WHERE key = ?", (key,))
        return
    engine._send("DELETE", f"/{engine.meta_alias()}/_doc/{key}")  # type: ignore[attr-defined]
