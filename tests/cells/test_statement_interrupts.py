"""Interrupts (Ctrl-C, and SIGTERM, which one-shot commands raise as it) that land in a
database statement stay interrupts, on every dialect: not a driver error, not lost."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from cellsight.cells.database import Engines, connect, create_database, write_transaction
from cellsight.cells.mappings import CellRegistry
from cellsight.query.sqlite_regexp import install_on_engine
from tests.support.waiting import wait_for


def test_an_interrupt_inside_a_statement_stays_an_interrupt(registry: CellRegistry) -> None:
    """Ctrl-C (or SIGTERM, raised as it by one-shot commands) landing in the driver's
    execute: the caller sees the ``KeyboardInterrupt``, and the engine serves the next
    caller. The SQLite statement deadline's rollback hook asked the invalidated
    connection for its driver connection and raised ``PendingRollbackError`` in its
    place: an ``index verify`` stopped by SIGTERM ended "internal error", exit 1."""
    engines = Engines(connect_timeout=5, statement_timeout=30)
    try:
        engine = engines.get(registry.api_url)

        @sa.event.listens_for(engine, "do_execute")
        def _interrupted(cursor: Any, statement: str, *args: Any) -> bool:
            if "interrupted" in statement:  # the statement, not SQLite's BEGIN before it
                raise KeyboardInterrupt
            return False

        with pytest.raises(KeyboardInterrupt), connect(engine) as conn:
            conn.execute(sa.text("SELECT 1 AS ready"))
            conn.execute(sa.text("SELECT 1 AS interrupted WHERE 1 = :one"), {"one": 1})
        with connect(engine) as conn:
            assert conn.execute(sa.text("SELECT 2 WHERE 1 = :one"), {"one": 1}).scalar() == 2
    finally:
        engines.dispose()


def _inside_the_driver(thread: int, since: list[Any]) -> bool:
    """Whether ``thread`` has been inside the driver's execute (the frame that called
    the C code unmoved, whatever callbacks run above it) for 20 ms: SQLite runs."""
    frame = sys._current_frames().get(thread)
    while frame is not None and frame.f_code.co_name != "do_execute":
        frame = frame.f_back
    where = None if frame is None else (frame.f_code, frame.f_lasti)
    if where is None or since[1:] != [where]:
        since[:] = [time.monotonic(), where]
        return False
    return time.monotonic() - since[0] >= 0.02


@pytest.mark.parametrize("callback", ["progress handler", "regexp"])
def test_a_signal_during_a_sqlite_statement_is_an_interrupt(tmp_path: Path, callback: str) -> None:
    """An interrupt probe: a Ctrl-C during a SQLite statement ended a seed with a
    database error, "OperationalError: interrupted" (exit 1): the signal's handler ran
    in the statement deadline's progress handler, the only Python code SQLite runs, and
    sqlite3 aborted the statement and dropped the KeyboardInterrupt. A review: in a
    ``=~`` filter's REGEXP function too ("user-defined function raised exception")."""
    url = f"sqlite:///{tmp_path / 'slow.db'}"
    create_database(url)
    engines = Engines(connect_timeout=5, statement_timeout=60)
    engine = engines.get(url)
    install_on_engine(engine, timeout=60)
    probe = sa.Table("slow_probe", sa.MetaData(), sa.Column("n", sa.Integer))
    probe.create(engine)
    with write_transaction(engine) as conn:
        conn.execute(probe.insert(), [{"n": i} for i in range(1000)])
    a, b, c = probe.alias("a"), probe.alias("b"), probe.alias("c")
    where = a.c.n + b.c.n > c.c.n
    if callback == "regexp":
        where = sa.and_(where, sa.cast(a.c.n + b.c.n - c.c.n, sa.Text).regexp_match("^1"))
    slow = sa.select(sa.func.count()).select_from(a, b, c).where(where)
    main = threading.get_ident()
    since: list[Any] = [0.0]

    def interrupt() -> None:
        wait_for(lambda: _inside_the_driver(main, since), 30, "the statement running")
        signal.pthread_kill(main, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    sender = threading.Thread(target=interrupt)
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt), connect(engine) as conn:
            conn.execute(slow).scalar()
        with connect(engine) as conn:  # and the engine serves the next caller
            assert conn.execute(sa.select(sa.func.count()).select_from(probe)).scalar() == 1000
    finally:
        sender.join()
        signal.signal(signal.SIGINT, previous)
        engines.dispose()
