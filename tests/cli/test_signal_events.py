"""Signals set an event from a thread of their own (``cellsight.signal_events``): a
handler that set it itself hung a worker for good when a second signal arrived inside
the first handler's ``Event.set`` (a review: Ctrl-C, then the forwarded SIGTERM)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from cellsight.signal_events import EventOnSignal, ignored_while_spawning


@pytest.fixture
def usr1() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


def test_signals_set_the_event_from_another_thread(usr1: None) -> None:
    stop = threading.Event()
    said: list[tuple[int, str]] = []
    EventOnSignal(
        stop, (signal.SIGUSR1,), lambda n: said.append((n, threading.current_thread().name))
    )
    os.kill(os.getpid(), signal.SIGUSR1)
    assert stop.wait(10)
    assert said[0] == (signal.SIGUSR1, "signals")  # said on the watching thread


class Watched(threading.Event):
    """An event that records the thread of every ``set``."""

    def __init__(self) -> None:
        super().__init__()
        self.setters: list[str] = []

    def set(self) -> None:
        self.setters.append(threading.current_thread().name)
        super().set()


def test_the_handler_never_sets_the_event_itself(usr1: None) -> None:
    """Two signals, the second inside the first handler's run as far as the handler can
    tell: neither sets the event on the main thread, where its lock may be held."""
    stop = Watched()
    seen = threading.Semaphore(0)
    events = EventOnSignal(stop, (signal.SIGUSR1,), lambda n: seen.release())
    events._handle(signal.SIGUSR1, None)
    events._handle(signal.SIGUSR1, None)
    assert seen.acquire(timeout=10) and seen.acquire(timeout=10)
    assert stop.wait(10)
    assert stop.setters and threading.main_thread().name not in stop.setters


def test_a_signal_is_ignored_only_while_spawning(usr1: None) -> None:
    handler = signal.signal(signal.SIGUSR1, lambda n, f: None)
    with ignored_while_spawning((signal.SIGUSR1,)):
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGUSR1) is not signal.SIG_IGN
    assert handler is not None
