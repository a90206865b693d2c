"""Loading a seed's cells in parallel worker processes, and stopping them.

The parent owns every stop: workers ignore SIGINT and SIGTERM (a Ctrl-C reaches the
whole process group) and end at their next chunk once the parent sets the shared stop
event, or once the parent itself is gone. The parent awaits them before it undoes what
the seed made, so no worker writes into a cell being removed. Before, a Ctrl-C sent to
the parent alone let every worker load its whole cell first (the Ctrl-C of a large seed
took as long as the seed), and a killed parent left them loading for nobody (and, idle,
waiting for a job forever).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import queue as queuelib
import signal
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import connection
from multiprocessing.queues import Queue as ProcessQueue
from multiprocessing.synchronize import Event

from cellsight.cells import bulk
from cellsight.cells.database import create_engine
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.schema import instance_mappings
from cellsight.cells.seed import CellJob, Progress, SeedReport, Tuples, load_cell
from cellsight.signal_events import signals_held

MAPPING_BATCH = 50_000  # mappings the parent writes per transaction
POLL = 0.1  # seconds between the parent's looks at its workers' progress
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class SeedStopped(Exception):
    """A worker stopped at the parent's request (or because the parent is gone)."""


_progress_queue: ProcessQueue[int] | None = None
_stop: Event | None = None


def _init_worker(progress_queue: ProcessQueue[int], stop: Event) -> None:
    global _progress_queue, _stop
    _progress_queue, _stop = progress_queue, stop
    _die_with_parent()
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # also drops one that came while blocked
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> None:
    """A parent killed outright (SIGKILL) cannot stop its workers, and an idle worker,
    blocked reading the pool's queue, never reached ``_check_stop``: two of them (70 MB
    each) and the resource tracker were found alive minutes later. On Linux the kernel
    kills the worker when its parent dies; elsewhere ``_check_stop`` still stops a
    loading one."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(1)  # the parent died before the request took effect


def _check_stop() -> None:
    parent = multiprocessing.parent_process()
    if (_stop is not None and _stop.is_set()) or (parent is not None and not parent.is_alive()):
        raise SeedStopped


def _report(n: int) -> None:
    if _progress_queue is not None:
        _progress_queue.put(n)
    _check_stop()  # after each committed chunk: the cheapest point to stop at


def _work(job: CellJob) -> tuple[Tuples, SeedReport]:
    _check_stop()  # a job queued before the stop must not start loading
    engine = create_engine(job.url, job.timeouts)
    report = SeedReport()
    try:
        mappings = load_cell(job, engine, None, report, _report)
    finally:
        engine.dispose()
    return mappings, report


def load_parallel(
    registry: CellRegistry,
    jobs: list[CellJob],
    workers: int,
    report: SeedReport,
    progress: Progress | None,
) -> None:
    """Load ``jobs`` in ``workers`` processes; the parent writes each cell's mappings
    once its rows are in. Interrupted or failed, the workers are stopped and awaited."""
    # spawn, not fork: the parent holds database connections and maybe threads.
    context = multiprocessing.get_context("spawn")
    progress_queue: ProcessQueue[int] = context.Queue()
    stop = context.Event()

    def drain() -> None:
        while True:
            try:
                n = progress_queue.get_nowait()
            except queuelib.Empty:
                return
            if progress is not None:
                progress(n)

    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_init_worker, initargs=(progress_queue, stop)
    ) as pool:
        try:
            # The first submit starts the workers. They start with the signals blocked (a
            # mask outlives exec) until their initializer ignores them: a Ctrl-C while
            # they import would otherwise print a traceback for each. The parent gets a
            # signal that came meanwhile once they are unblocked again.
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                pending = {pool.submit(_work, j) for j in jobs}
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            with bulk.loading(registry.api_engine) as api:
                while pending:
                    finished, pending = wait(pending, timeout=POLL, return_when=FIRST_COMPLETED)
                    drain()
                    for future in finished:
                        mappings, part = future.result()
                        mappings.sort()  # uuid order: the mapping indexes grow at one end
                        for i in range(0, len(mappings), MAPPING_BATCH):
                            with api.begin():
                                bulk.insert(
                                    api,
                                    instance_mappings,
                                    bulk.MAPPING_COLUMNS,
                                    mappings[i : i + MAPPING_BATCH],
                                )
                        report.mappings += len(mappings)
                        report.instances += part.instances
                        report.compute_nodes += part.compute_nodes
        except BaseException:
            _stop_workers(pool, stop)
            raise
    drain()


def _stop_workers(pool: ProcessPoolExecutor, stop: Event) -> None:
    """Tell the workers to stop at their next chunk and wait until they have exited.

    A second Ctrl-C (or SIGTERM) while waiting kills them instead: a worker stuck in a
    database call would otherwise hold the clean-up up for as long as it is stuck.
    """
    stop.set()
    # The pool has no public handle on its processes; they are needed to await and kill.
    processes = list(pool._processes.values())
    pool.shutdown(wait=False, cancel_futures=True)
    with signals_held() as interrupted_again:
        for process in processes:
            # The sentinel, not is_alive(): the pool's own thread reaps these processes.
            while not connection.wait([process.sentinel], POLL):
                if interrupted_again():
                    process.kill()
