"""Polling with a deadline on an observable condition: the tests' only way to wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def wait_for(
    predicate: Callable[[], object], timeout: float = 30.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Running, not merely a zombie waiting for init to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def spawned(pid: int) -> list[int]:
    """The ``multiprocessing`` spawn children of ``pid`` (not its resource tracker, not
    the embedded bus's Redis server), from every thread of it."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for kid in kids:
            try:
                cmdline = Path(f"/proc/{kid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
                found.append(int(kid))
    return found
