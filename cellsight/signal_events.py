"""Signals that set a ``threading.Event``, from a thread of their own.

A Python signal handler runs in the main thread between two of its bytecodes, and
``Event.set`` takes the event's lock: a second signal arriving while the first handler
was inside ``set`` ran a second ``set`` there, on the lock its own thread held, and the
process hung for good (a review: Ctrl-C sends SIGINT to every worker of `indexer
--workers N`, and the supervisor forwards SIGTERM milliseconds later). So the handler
only writes the signal's number to a pipe, which takes no lock, and a daemon thread
reads it, says so and sets the event.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import FrameType


class EventOnSignal:
    """Installs handlers for ``signals`` that set ``event``; ``said(signum)`` runs first,
    on the watching thread, once per signal received."""

    def __init__(
        self,
        event: threading.Event,
        signals: Iterable[signal.Signals],
        said: Callable[[int], None] = lambda signum: None,
    ) -> None:
        self.event = event
        self.said = said
        read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        threading.Thread(target=self._watch, args=(read,), name="signals", daemon=True).start()
        for sig in signals:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):  # a full pipe: a signal is already on its way
            os.write(self._write, bytes([signum]))

    def _watch(self, read: int) -> None:
        while data := os.read(read, 64):
            for signum in data:
                self.said(signum)
            self.event.set()


@contextmanager
def ignored_while_spawning(signals: Iterable[signal.Signals]) -> Iterator[None]:
    """``signals`` ignored while a child process is spawned: a new interpreter keeps an
    ignored SIGINT ignored until it sets a handler of its own, so a Ctrl-C (sent to the
    whole process group) cannot kill it while it imports. A blocked signal would not do:
    the spawned interpreter starts with none blocked. One that arrives in that moment is
    lost to this process. On the main thread only (elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def signals_held() -> Iterator[Callable[[], bool]]:
    """Count SIGINT and SIGTERM rather than raise them, for a clean-up that must finish;
    yields whether one came. The command is already on its way out as interrupted or
    failed, so a held signal has nothing more to say and is dropped afterwards."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False  # only the main thread gets signals (or can set handlers)
        return

    def hold(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: bool(caught)
    finally:
        for sig, handler in previous.items():
            # None: a handler installed from C, which Python cannot put back.
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
