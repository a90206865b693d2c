"""A reader that stops reading (``cellsight index get UUID | head``) ends a command
quietly, as it ends any Unix tool: no ``error:`` line, no "Exception ignored" at exit.

The exit code is 141, 128 + SIGPIPE: what the shell reports for a tool the closed pipe
stopped (``yes | head; echo ${PIPESTATUS[0]}``), by the same 128 + signal rule as the
130 of Ctrl-C (``cellsight.cli.errors``). Python ignores SIGPIPE and raises
``BrokenPipeError`` instead; Click and the recipe in Python's ``signal`` documentation
silence the dead stdout as done here but exit 1, which in this CLI's convention means a
runtime failure (a bus, engine or database), and a closed pipe is none.
"""

from __future__ import annotations

import os
import stat
import sys

from cellsight.cli.errors import CLOSED_PIPE


def stdout_closed() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has gone. A broken pipe of
    another kind (a bus's or an engine's connection) is a failure to report."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced (a test's capture) or closed
        return False
    if not hasattr(select, "poll"):  # pragma: no cover - every POSIX system has poll
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)  # POLLERR is always reported: no reader left
    return any(events & select.POLLERR for _, events in poller.poll(0))


def silence_stdout() -> int:
    """Point stdout at /dev/null, so the interpreter's last flush of what is still
    buffered does not fail again; returns the exit code to end with."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (AttributeError, OSError, ValueError):  # pragma: no cover - nothing to silence
        pass
    return CLOSED_PIPE


def flush_stdout() -> int | None:
    """Flush what a command printed (a pipe buffers it until exit); the closed-pipe exit
    code if the reader has gone, else None."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return silence_stdout()
    except (AttributeError, ValueError):  # no stdout, or a closed one
        pass
    return None


def stdout_identity() -> os.stat_result | None:
    """What stdout is now, to tell later whether Rich silenced it (``silenced_since``)."""
    try:
        return os.fstat(sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        return None


def silenced_since(before: os.stat_result | None) -> bool:
    """Whether stdout was a pipe ``before`` and is /dev/null now: Rich's console, on a
    closed pipe, points stdout at /dev/null and raises ``SystemExit(1)`` itself (the
    help, which Typer prints through its own console before any command runs)."""
    if before is None or not stat.S_ISFIFO(before.st_mode):
        return False
    now = stdout_identity()
    try:
        return now is not None and os.path.samestat(now, os.stat(os.devnull))
    except OSError:
        return False
