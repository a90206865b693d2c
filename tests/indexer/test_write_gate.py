"""The verify's repair writes, at most as many at once as the engine takes: a stop ends
a wait for a slot, ``drain`` waits for the writes under way, a lost lock stops them all."""

from __future__ import annotations

import threading

import pytest

from cellsight.indexer.write_gate import WriteGate


class Stopped(Exception):
    pass


def test_a_stop_ends_the_wait_for_a_slot() -> None:
    stop = threading.Event()
    gate = WriteGate(1, stop)
    inside, waiting_out = threading.Event(), threading.Event()
    outcome: list[BaseException] = []

    def holder() -> None:
        with gate.writing(Stopped):
            inside.set()
            waiting_out.wait(30)

    def waiter() -> None:
        try:
            with gate.writing(Stopped):
                outcome.append(AssertionError("written after the stop"))
        except Stopped as exc:
            outcome.append(exc)

    held = threading.Thread(target=holder)
    held.start()
    assert inside.wait(30)
    second = threading.Thread(target=waiter)
    second.start()
    stop.set()
    second.join(30)
    assert not second.is_alive() and len(outcome) == 1 and isinstance(outcome[0], Stopped)
    assert not gate.drain(0.2)  # the holder still writes
    waiting_out.set()
    held.join(30)
    assert gate.drain(30)


def test_no_write_starts_once_stopped_even_with_a_slot_free() -> None:
    stop = threading.Event()
    stop.set()
    with pytest.raises(Stopped), WriteGate(2, stop).writing(Stopped):
        pytest.fail("a write began after the stop")


def test_a_lost_lock_stops_every_writer() -> None:
    stop = threading.Event()

    def lost() -> None:
        raise RuntimeError("the instance lock was lost")

    gate = WriteGate(4, stop, lost)
    with pytest.raises(RuntimeError, match="lock was lost"), gate.writing(Stopped):
        pytest.fail("written without the lock")
    assert stop.is_set()
    assert gate.drain(1)  # the slot was given back
