"""``fn`` over items in daemon threads, for work that may block in a cell's database.

A ``ThreadPoolExecutor``'s threads are joined when the pool's block ends and again when
the interpreter exits, so Ctrl-C or SIGTERM to ``index verify`` waited for a thread
blocked in a cell's query (a table locked by another session) until the lock was
released: 40 to 60 s in the probe, holding the maintenance lock meanwhile. Daemon
threads let the interrupted caller release its lock and exit after a short grace;
what such a thread was reading is only a read, and the connection goes with the
process.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


GRACE = 5.0  # seconds an interrupted caller waits for its threads to stop


def map_in_daemons(
    fn: Callable[[T], R],
    items: Sequence[T],
    workers: int,
    name: str,
    on_interrupt: Callable[[], None],
) -> list[R]:
    """``[fn(item) for item in items]``, in order, ``workers`` at a time; an exception
    out of ``fn`` is raised once every item is done. Interrupted (a signal's exception
    in the caller's wait), ``on_interrupt`` tells the threads to stop and the caller
    waits up to ``GRACE`` for them: they stop at their next step, and the caller's
    clean-up must not close what they are still using (an engine closed under a thread
    inside SQLite ended the process with SIGSEGV). One blocked in a database call for
    longer is left behind."""
    if not items:
        return []
    results: dict[int, R] = {}
    errors: list[BaseException] = []
    todo: queue.SimpleQueue[tuple[int, T]] = queue.SimpleQueue()
    for entry in enumerate(items):
        todo.put(entry)
    left = [len(items)]
    count = threading.Lock()
    finished = threading.Event()

    def work() -> None:
        while True:
            try:
                index, item = todo.get_nowait()
            except queue.Empty:
                return
            try:
                results[index] = fn(item)
            except BaseException as exc:  # handed to the caller
                errors.append(exc)
            with count:
                left[0] -= 1
                if not left[0]:
                    finished.set()

    try:
        # Started inside: an interrupt that lands while the threads start (a probe: a
        # verify went on to repair everything, then said "interrupted") stops them too.
        for n in range(min(max(1, workers), len(items))):
            threading.Thread(target=work, name=f"{name}-{n}", daemon=True).start()
        finished.wait()
    except BaseException:
        on_interrupt()
        finished.wait(GRACE)
        raise
    if errors:
        raise errors[0]
    return [results[i] for i in range(len(items))]
