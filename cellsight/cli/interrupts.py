"""SIGTERM as Ctrl-C for a one-shot command, so both clean up the same way (exit 130)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises KeyboardInterrupt: a service manager's or
    ``timeout``'s stop cleans up as Ctrl-C does. A seed undoes what it made (it was
    killed with its cells registered half-loaded); a sync's half-built index goes and
    the aliases come back; a verify stops its cells and releases its lock."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
