"""``cellsight indexer``'s processes: one consumer, or ``--workers N`` of them.

N workers are N competing consumers on the one indexer queue. That is safe because every
write is versioned: whichever worker writes an instance's older event last, the engine
keeps the newest version. Each worker is a whole indexer (its own bus connection, engine
client and write pipeline), so decoding, which holds Python's GIL, runs on N cores. With
``write_process`` (the default) each worker also has its writer process
(``cellsight.indexer.write_process``): one worker is already two processes.

The supervisor forwards SIGTERM/SIGINT to every worker, which finishes and acks what it
received (bounded, see ``cellsight.indexer.consumer``) and exits; if one worker dies, the others
are stopped too and the exit code is non-zero, so that the service manager restarts the
whole indexer (the dead worker's unacked messages are redelivered meanwhile). A supervisor
killed outright forwards nothing: each worker watches it and stops the same way.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import signal
import sys
import threading
from multiprocessing.connection import wait as mp_wait
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

from cellsight.cli.context import console, error_line
from cellsight.settings import Settings
from cellsight.signal_events import EventOnSignal, ignored_while_spawning

if TYPE_CHECKING:
    from cellsight.cli.logs import LogSetup
    from cellsight.indexer.engines.base import SearchEngine
    from cellsight.indexer.writer import CellLookup

JOIN_POLL = 0.5  # seconds between checks that every worker is alive
PARENT_POLL = 0.5  # seconds between a worker's checks that its supervisor is alive
VERIFY_GRACE = 10.0  # seconds a stopping worker waits for its periodic verify to stop


def watch_supervisor(supervisor: int, stop: threading.Event, name: str) -> threading.Thread:
    """Set ``stop`` once this process's parent is no longer ``supervisor``: a supervisor
    killed outright (SIGKILL, the OOM killer) leaves its workers to init, and they would
    consume on, unsupervised, beside the indexer started in its place."""

    def watch() -> None:
        while not stop.wait(PARENT_POLL):
            if os.getppid() != supervisor:
                console.print(f"{name}: supervisor {supervisor} gone: flushing and stopping")
                stop.set()

    thread = threading.Thread(target=watch, name="supervisor-watch", daemon=True)
    thread.start()
    return thread


def ready_engine(settings: Settings, stop: threading.Event | None) -> SearchEngine | None:
    """The engine, its indexes and aliases made, an engine's transient failure (a
    timeout, a refused connection) retried for about half a minute: a seven-second stall
    of the engine as the indexer started took every worker down (a probe). None if
    ``stop`` was set meanwhile."""
    from cellsight.clients import build_engine
    from cellsight.indexer.retries import RetryStopped, retrying

    def attempt() -> SearchEngine:
        engine = build_engine(settings)  # asks the engine its distribution
        try:
            for resource in ("instance", "node"):
                engine.ensure_ready(resource)
        except BaseException:
            engine.close()
            raise
        return engine

    stopped = stop.is_set if stop is not None else (lambda: False)
    try:
        return retrying(attempt, "preparing the search engine's indexes", stopped=stopped)
    except RetryStopped:
        return None


def consume(
    settings: Settings, worker: int | None = None, supervisor: int | None = None
) -> dict[str, int]:
    """One indexer consumer until SIGTERM/SIGINT; returns its verdict totals. Worker 0
    also runs the periodic anti-entropy repair; worker ``i`` serves metrics on
    ``metrics_port + i``. A worker stops when its ``supervisor`` process is gone."""
    from cellsight.cli import logs
    from cellsight.cli.outbox_cmd import relay_beside_indexer
    from cellsight.clients import (
        build_bus,
        build_cell_resolver,
        build_consumer_config,
    )
    from cellsight.indexer.consumer import IndexerConsumer
    from cellsight.indexer.outcomes import totals_line

    stop = threading.Event()
    name = "indexer" if worker is None else f"indexer[{worker}]"
    worker = worker or 0

    EventOnSignal(
        stop,
        (signal.SIGTERM, signal.SIGINT),
        lambda signum: console.print(f"{name}: signal {signum}: flushing and stopping"),
    )
    if supervisor is not None:
        watch_supervisor(supervisor, stop, name)
    if settings.metrics_port is not None:
        from cellsight.cli.ports import serve_metrics
        from cellsight.settings import setting_label

        port = settings.metrics_port + worker if settings.metrics_port else 0  # 0: any
        serve_metrics(port, setting_label(settings, "metrics_port"))
    engine = ready_engine(settings, stop)
    if engine is None:
        console.print(f"{name} stopped before its engine answered", highlight=False)
        return {}
    verifying: threading.Thread | None = None
    try:
        from cellsight.indexer import metrics

        metrics.ENGINE_UP.set(1)  # it answered; a write that must be retried sets 0
        if settings.verify_interval and worker == 0:
            from cellsight.cells.mappings import CellRegistry
            from cellsight.indexer.antientropy import start_periodic_verify

            registry = CellRegistry.from_settings(settings)
            verifying = start_periodic_verify(engine, registry, settings.verify_interval, stop)
        config = build_consumer_config(settings)
        with build_bus(settings) as bus, bus.connection() as connection:
            consumer = IndexerConsumer(
                connection,
                engine,
                config,
                stop=stop,
                cell_resolver=build_cell_resolver(settings),
                write_process=(
                    functools.partial(_write_side, settings, logs.current())
                    if settings.write_process
                    else None
                ),
                collect_between_batches=True,  # a process dedicated to the indexer
                revive_bus=bus.reviver,  # each worker asks: one starts it, the rest attach
            )
            where = "a writer process" if settings.write_process else "writer threads"
            console.print(
                f"{name}: {engine.distribution} engine, queue {config.queue} on "
                f"{bus.display_url}, {consumer.in_flight} write(s) in flight in {where}"
            )
            # One relay per indexer (worker 0): the outbox's lease serialises relays anyway.
            relaying = relay_beside_indexer(settings, bus, stop) if worker == 0 else None
            try:
                consumer.run()
            finally:
                stop.set()
                if relaying is not None:
                    notifier, thread = relaying
                    thread.join(2 * settings.publish_timeout)  # its passes under way
                    notifier.close()
            console.print(f"{name} stopped: {totals_line(consumer.totals)}", highlight=False)
            return consumer.totals
    finally:
        stop.set()
        if verifying is not None:  # stopped with ``stop``: not closed under its threads
            verifying.join(VERIFY_GRACE)
            if verifying.is_alive():
                late = f"{name}: the periodic verify did not stop within {VERIFY_GRACE:.0f} s"
                console.print(f"{late}; closing the engine", highlight=False)
        engine.close()


def _write_side(settings: Settings, log_setup: LogSetup) -> tuple[SearchEngine, CellLookup]:
    """``clients.build_write_side`` in an indexer's writer process, which logs as the
    command does (the engine's client lives there)."""
    from cellsight.cli import logs
    from cellsight.clients import build_write_side

    logs.configure(log_setup)
    return build_write_side(settings)


def _worker_main(
    settings: Settings,
    worker: int,
    supervisor: int,
    debug: bool = False,
    log_setup: LogSetup | None = None,
) -> None:
    """One worker process. What stops it is told as the CLI tells it, in one line naming
    the worker (``--debug``: the traceback instead); it exits 1, as before."""
    if log_setup is not None:
        from cellsight.cli import logs

        logs.configure(log_setup)
    try:
        consume(settings, worker, supervisor)
    except Exception as exc:
        if debug:
            raise
        from cellsight.cli.errors import RUNTIME, describe

        _, message = describe(exc, settings.bus_url)
        error_line(f"indexer[{worker}]: {message}")
        sys.exit(RUNTIME)


def _killed(exitcode: int) -> str:
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    return f"worker process killed by {name}"


def supervise(settings: Settings, workers: int, debug: bool = False) -> int:
    """Run ``workers`` consumer processes until a signal (then 0 if all stopped cleanly)
    or until one of them exits on its own (then non-zero, after stopping the others)."""
    from cellsight.cells.mappings import CellRegistry
    from cellsight.cli import logs

    # Indexes, aliases and the API database's schema are created once, here: N processes
    # creating them at once race (an embedded SQLite file answers "database is locked").
    engine = ready_engine(settings, None)
    if engine is not None:
        engine.close()
    CellRegistry.from_settings(settings).close()
    stopping = threading.Event()
    # "spawn": a fresh interpreter per worker, no copy of this process's clients or locks.
    ctx = mp.get_context("spawn")
    procs: list[BaseProcess] = [
        ctx.Process(
            target=_worker_main,
            # Our pid, not the worker's first getppid(): we may die before it starts.
            args=(settings, i, os.getpid(), debug, logs.current()),
            name=f"indexer-{i}",
            daemon=False,
        )
        for i in range(workers)
    ]

    signalled = threading.Event()
    EventOnSignal(signalled, (signal.SIGTERM, signal.SIGINT), lambda signum: stopping.set())
    # A Ctrl-C reaches the whole process group, and workers still importing died of it
    # (exit 1): each starts with SIGINT ignored until ``consume`` sets its handler, and
    # this process forwards the Ctrl-C as SIGTERM.
    try:
        for proc in procs:
            with ignored_while_spawning((signal.SIGINT,)):
                proc.start()
    except BaseException:
        for proc in procs:
            if proc.pid is not None:
                proc.terminate()
        raise
    console.print(f"indexer: {workers} worker processes: {[p.pid for p in procs]}")
    forwarded = False
    while any(p.is_alive() for p in procs):
        if not stopping.is_set() and any(p.exitcode is not None for p in procs):
            dead = [f"{p.name} (exit {p.exitcode})" for p in procs if p.exitcode is not None]
            console.print(f"indexer: {', '.join(dead)} stopped on its own; stopping the others")
            for i, proc in enumerate(procs):
                if proc.exitcode is not None and proc.exitcode < 0:
                    # Killed: it said nothing itself, as a worker that fails does.
                    error_line(f"indexer[{i}]: {_killed(proc.exitcode)}")
            stopping.set()
        if stopping.is_set() and not forwarded:
            for proc in procs:
                if proc.is_alive() and proc.pid is not None:
                    proc.terminate()  # SIGTERM: the worker flushes, acks and exits
            forwarded = True
        if stopping.is_set():
            # Until a worker exits: ``stopping.wait``, already set, returned at once and
            # this loop spun a core while the workers flushed.
            mp_wait([p.sentinel for p in procs if p.exitcode is None], JOIN_POLL)
        else:
            stopping.wait(JOIN_POLL)  # a signal's handler sets it: forwarded at once
        for proc in procs:
            proc.join(0)
    codes = [p.exitcode for p in procs]
    console.print(f"indexer: workers exited with {codes}")
    # Told to stop, a worker our SIGTERM reached before it set its handler (still
    # starting: it had taken nothing) stopped as asked too.
    stopped = {0, -signal.SIGTERM} if signalled.is_set() else {0}
    return 0 if all(code in stopped for code in codes) and forwarded else 1
