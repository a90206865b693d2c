"""SIGTERM as Ctrl-C for a one-shot command, so both clean up the same way (exit 130)."""

from __future__ import annotations

import inspect
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType


def _lines_calling(function: Callable[..., object], call: str) -> list[int]:
    try:
        lines, first = inspect.getsourcelines(function)
    except OSError:  # a Python installed without its sources: the plain Lock's case only
        return []
    return [first + n for n, text in enumerate(lines) if call in text]


# Where an exception raised by a signal handler can break a lock: in the methods of
# ``threading.Condition`` between taking and giving back its lock, outside the ``with``
# that would undo it. ``Condition.wait`` takes its lock back in a ``finally``
# (``_acquire_restore``); a signal that interrupts that acquire raises out of it, and the
# ``with`` around the wait then releases a lock this thread does not hold
# ("RuntimeError: release unlocked lock", here or in the thread that held it): seen as an
# ``index verify`` stopped by SIGTERM just as it started a thread (``Thread.start``
# waits on such a condition). One raised in ``__enter__`` after its acquire leaves the
# lock held for good.
_UNSAFE = frozenset(
    getattr(threading.Condition, name).__code__
    for name in (
        "__enter__", "__exit__", "wait", "notify", "notify_all",
        "_release_save", "_acquire_restore", "_is_owned",
    )
)  # fmt: skip
# Where the lock is being taken back after a wait, for which no later moment is safe:
# the interrupt waits until it is held (a CI run: a holder descheduled past
# PUT_OFF_AT_MOST under load saw it raised there, and the lock broken).
_RETAKING = frozenset(
    [(threading.Condition._acquire_restore.__code__, None)]  # type: ignore[attr-defined]
    + [  # an RLock's: its C method is called from the wait's own line
        (threading.Condition.wait.__code__, line)
        for line in _lines_calling(threading.Condition.wait, "self._acquire_restore(")
    ]
)
RETRY_AFTER = 0.001  # seconds: the lock's holder gives it back within microseconds
# A wait blocks in ``Condition.wait`` where an interrupt is safe (before the lock is
# taken back), and may block there for minutes: past this, the interrupt is raised
# wherever it lands rather than put off again.
PUT_OFF_AT_MOST = 0.1  # seconds


class _State:
    put_off_since: float | None = None  # when the interrupt now put off first came
    closing = False  # the block is ending: an interrupt is recorded, not raised


_state = _State()


def raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """A signal handler that raises ``KeyboardInterrupt``, except inside a lock's
    critical few instructions: there it sends itself again (``SIGALRM``) a millisecond
    later, for at most ``PUT_OFF_AT_MOST``."""
    now = time.monotonic()
    if signum == signal.SIGALRM and _state.put_off_since is None:
        return  # the timer of an interrupt already raised: nothing is put off
    if _state.closing:
        _state.put_off_since = _state.put_off_since or now  # raised once restored
        return
    if frame is not None and (frame.f_code in _UNSAFE or _finalizing(frame)):
        if _state.put_off_since is None:
            _state.put_off_since = now
        if _retaking(frame) or now - _state.put_off_since < PUT_OFF_AT_MOST:
            signal.setitimer(signal.ITIMER_REAL, RETRY_AFTER)
            return
    # Raised once: no timer left to raise it again in the clean-up it starts.
    signal.setitimer(signal.ITIMER_REAL, 0)
    _state.put_off_since = None
    raise KeyboardInterrupt


def _retaking(frame: FrameType) -> bool:
    return (frame.f_code, None) in _RETAKING or (frame.f_code, frame.f_lineno) in _RETAKING


def _finalizing(frame: FrameType | None, depth: int = 32) -> bool:
    """Whether ``frame`` runs in a ``__del__``: Python drops what a finalizer raises
    ("Exception ignored in ..."), so an interrupt raised there was lost and the command
    ran on to the end (an interrupt probe: a seed's driver connection finalized)."""
    while frame is not None and depth > 0:
        if frame.f_code.co_name == "__del__":
            return True
        frame, depth = frame.f_back, depth - 1
    return False


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises KeyboardInterrupt: a service manager's or
    ``timeout``'s stop cleans up as Ctrl-C does. A seed undoes what it made (it was
    killed with its cells registered half-loaded); a sync's half-built index goes and
    the aliases come back; a verify stops its cells and releases its lock. Ctrl-C
    takes the same handler, which never raises where a lock would be left broken.
    The block owns SIGALRM and the real-time timer (nothing else in the CLI uses them)."""
    signals = [signal.SIGTERM, signal.SIGALRM]  # SIGALRM: an interrupt put off, again
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signals.append(signal.SIGINT)  # not where it is ignored (started in the background)
    previous = {signum: signal.signal(signum, raise_interrupt) for signum in signals}
    closing_before = _state.closing
    raised = False
    try:
        yield
    except BaseException:
        raised = True
        raise
    finally:
        _state.closing = True  # from here a signal is recorded: the handlers go back first
        signal.setitimer(signal.ITIMER_REAL, 0)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        put_off = _state.put_off_since is not None
        _state.put_off_since = None
        _state.closing = closing_before
        if put_off and not raised:
            raise KeyboardInterrupt  # put off as the block ended: not lost with the timer
