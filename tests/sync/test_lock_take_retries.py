"""Taking the maintenance lock beside a busy engine: an attempt that timed out is tried
again, and a take whose answer was lost (the engine applied it, early or late) is found
to be this process's own, released if the run does not go on, and never adopted once
another owner has taken the lock over."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.lock import LockHeld, MaintenanceLock, lock_key
from tests.support.sync_world import make_engine


@pytest.fixture
def engine(request: pytest.FixtureRequest, engine_kind: str, tmp_path: Path) -> Iterator[Any]:
    made = make_engine(request, engine_kind, tmp_path / "index.db")
    yield made
    made.close()


def test_taking_the_lock_rides_out_a_busy_engine(
    engine: SearchEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe: one 5 s timeout taking the lock beside a busy indexer failed a whole
    sync. A read that timed out is tried again, and a take whose answer was lost (it was
    applied) is found to be this lock's own, not another's."""
    from cellsight.indexer import retries
    from cellsight.indexer.engines.base import EngineTimeout

    monkeypatch.setattr(retries, "MAX_BACKOFF", 0.02)  # the waits, not the attempts
    read, swap = engine.get_meta, engine.swap_meta
    failures = {"read": 2, "swap": 1}

    def slow_read(key: str) -> Any:
        if failures["read"]:
            failures["read"] -= 1
            raise EngineTimeout("read timed out")
        return read(key)

    def lost_answer(key: str, expected: Any, new: Any) -> bool:
        done = swap(key, expected, new)
        if failures["swap"]:
            failures["swap"] -= 1
            raise EngineTimeout("read timed out (the write was applied)")
        return done

    monkeypatch.setattr(engine, "get_meta", slow_read)
    monkeypatch.setattr(engine, "swap_meta", lost_answer)
    lock = MaintenanceLock(engine, "instance", "sync")
    lock.acquire()
    assert failures == {"read": 0, "swap": 0}
    assert (read(lock_key("instance")) or {}).get("owner") == lock.owner
    lock.release()
    monkeypatch.setattr(engine, "get_meta", read)
    with MaintenanceLock(engine, "instance", "verify"):  # released: free again
        pass


def test_a_take_applied_after_its_retry_read_is_found_to_be_ours(
    engine: SearchEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: a take that timed out and was applied late, just after the retry's read
    answered, made the retry's swap fail; the lock was then called another's ("another
    verify just started: <this process>") and left held to its expiry."""
    from cellsight.indexer import retries
    from cellsight.indexer.engines.base import EngineTimeout

    monkeypatch.setattr(retries, "MAX_BACKOFF", 0.02)
    read, swap = engine.get_meta, engine.swap_meta
    queued: list[tuple[str, Any]] = []

    def late(key: str) -> Any:
        answer = read(key)
        for held in queued:  # the queued take lands once this read has answered
            swap(held[0], None, held[1])
        queued.clear()
        return answer

    def queued_take(key: str, expected: Any, new: Any) -> bool:
        if not queued and expected is None and read(key) is None:
            queued.append((key, new))
            raise EngineTimeout("read timed out (the engine applies it later)")
        return swap(key, expected, new)

    monkeypatch.setattr(engine, "get_meta", late)
    monkeypatch.setattr(engine, "swap_meta", queued_take)
    lock = MaintenanceLock(engine, "instance", "verify")
    lock.acquire()
    stored = read(lock_key("instance")) or {}
    assert stored.get("owner") == lock.owner and not stored.get("released")
    lock.release()
    monkeypatch.setattr(engine, "get_meta", read)
    monkeypatch.setattr(engine, "swap_meta", swap)
    with MaintenanceLock(engine, "instance", "sync"):  # released: free again
        pass


def test_a_take_applied_whose_retries_all_failed_is_released(
    engine: SearchEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: the take applied, its answer lost and the engine busy for every retry,
    the run failed and its lock stayed held to its expiry: the release did not know it
    had been taken."""
    from cellsight.indexer import retries
    from cellsight.indexer.engines.base import EngineTimeout

    monkeypatch.setattr(retries, "MAX_BACKOFF", 0.02)
    read, swap = engine.get_meta, engine.swap_meta
    busy = {"reads": 0}

    def busy_read(key: str) -> Any:
        if busy["reads"]:
            busy["reads"] -= 1
            raise EngineTimeout("read timed out")
        return read(key)

    def applied_then_busy(key: str, expected: Any, new: Any) -> bool:
        done = swap(key, expected, new)
        if not busy["reads"] and not (new or {}).get("released"):
            busy["reads"] = retries.RETRY_ROUNDS  # every retry's read, then it answers
            raise EngineTimeout("read timed out (the write was applied)")
        return done

    monkeypatch.setattr(engine, "get_meta", busy_read)
    monkeypatch.setattr(engine, "swap_meta", applied_then_busy)
    with pytest.raises(EngineTimeout), MaintenanceLock(engine, "instance", "sync"):
        pass
    stored = read(lock_key("instance")) or {}
    assert stored.get("released") is True  # not held to its expiry


def test_a_lost_take_found_taken_over_meanwhile_is_not_held(
    engine: SearchEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: a take whose answer was lost, found this process's own after retries
    that outlasted its expiry and taken over just then, was adopted anyway: the run went
    on beside the new holder (its clean-up before the first check included)."""
    from cellsight.indexer import retries
    from cellsight.indexer.engines.base import EngineTimeout

    monkeypatch.setattr(retries, "MAX_BACKOFF", 0.02)
    swap = engine.swap_meta
    theirs = {"owner": "another", "purpose": "sync", "host": "elsewhere", "pid": 1}
    calls = {"n": 0}

    def racing(key: str, expected: Any, new: Any) -> bool:
        calls["n"] += 1
        if calls["n"] == 1:  # the take: applied, its answer lost
            swap(key, expected, new)
            raise EngineTimeout("read timed out (the write was applied)")
        if calls["n"] == 2:  # the adoption's re-stamp: another took it over just before
            swap(key, expected, {**theirs, "expires_at": new["expires_at"]})
        return swap(key, expected, new)

    monkeypatch.setattr(engine, "swap_meta", racing)
    with pytest.raises(LockHeld), MaintenanceLock(engine, "instance", "verify"):
        pytest.fail("the run went on beside the lock's new holder")
    assert (engine.get_meta(lock_key("instance")) or {}).get("owner") == "another"
