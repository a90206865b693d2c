"""Ctrl-C and SIGTERM that land in SQLite's callbacks, given back as interrupts.

Python runs a signal's handler between two bytecodes of the main thread. During a
statement the only Python SQLite runs is its callbacks: the statement deadline's
progress handler and the ``REGEXP`` function. sqlite3 drops what a callback raises: it
aborts the statement ("interrupted" from a progress handler, "user-defined function
raised exception" from a function) and clears the exception, so Ctrl-C ended a command
with a database error, exit 1, or a loop that went on to the next cell (an interrupt
probe, then a review). With callback tracebacks on, sqlite3 hands the exception to
``sys.unraisablehook`` before clearing it: the hook installed here notes an interrupt
there, and the caller of the statement takes it back (``signalled``).
"""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

_pending = threading.local()  # signals run in the main thread; each thread its own
_quiet: weakref.WeakSet[Any] = weakref.WeakSet()
_installed = threading.Lock()
_hooked: list[bool] = []


def keep_interrupts(*callbacks: Callable[..., Any]) -> None:
    """Install the hook (once); ``callbacks`` are SQLite callbacks whose other errors stay
    unreported, as sqlite3 left them (their statement says what failed: a regex past its
    deadline)."""
    for callback in callbacks:
        _quiet.add(callback)
    with _installed:
        if _hooked:
            return
        previous = sys.unraisablehook

        def hook(unraisable: Any) -> None:
            kind = unraisable.exc_type
            if kind is not None and issubclass(kind, KeyboardInterrupt):
                _pending.interrupt = True  # lost here: the statement's caller raises it
            elif unraisable.object not in _quiet:
                previous(unraisable)

        sys.unraisablehook = hook
        sqlite3.enable_callback_tracebacks(True)
        _hooked.append(True)


def signalled(exc: BaseException, deadline: float) -> bool:
    """Whether SQLite's error ``exc`` stands for an interrupt that landed in one of its
    callbacks: one noted by the hook (taken, so it is raised once), or an abort by the
    progress handler before ``deadline`` (monotonic seconds), which only a handler that
    raised makes (``SQLITE_INTERRUPT`` is a deadline's code too)."""
    if not isinstance(exc, sqlite3.Error):
        return False
    if getattr(_pending, "interrupt", False):
        _pending.interrupt = False
        return True
    return (
        isinstance(exc, sqlite3.OperationalError)
        and getattr(exc, "sqlite_errorcode", 0) == sqlite3.SQLITE_INTERRUPT
        and time.monotonic() <= deadline
    )
