"""SQLite's ``REGEXP``: a Python ``re`` function, with a deadline per statement.

SQLite has the operator but no implementation: ``x REGEXP p`` calls the application's
``regexp(p, x)``. The patterns it gets are the portable subset's (``regex``), matched by
``regex.matcher``: ``re`` on values up to a name's length, whose worst case ``regex``
bounds, and an automaton, linear in the value, past it. The deadline bounds a whole
statement (checked before each row, and between blocks of a long value's characters),
so neither a scan of many values nor one 64 KiB description can hold a reader past it.
Both the embedded index (raw ``sqlite3`` connections) and SQLite cells (SQLAlchemy
engines) install it.
"""

from __future__ import annotations

import math
import sqlite3
import time
import weakref
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from cellsight.query.regex import matcher
from cellsight.sqlite_interrupts import keep_interrupts

DEFAULT_TIMEOUT = 10.0
_INSTALLED: weakref.WeakSet[sa.Engine] = weakref.WeakSet()


class RegexTimeout(Exception):
    """A statement's regex matching ran past its deadline."""


class RegexDeadline(sa.exc.TimeoutError):
    """What a statement on an engine with ``install_on_engine`` raises when its regex
    matching ran past its deadline: SQLite reports any error of a function as a plain
    "user-defined function raised exception", which says neither that nor "timeout"."""


class Deadline:
    """The deadline of the statement running on one connection (``inf``: none)."""

    def __init__(self) -> None:
        self.at = math.inf
        self.expired = False

    def arm(self, seconds: float) -> None:
        self.at, self.expired = time.monotonic() + seconds, False

    def disarm(self) -> None:
        self.at = math.inf


def regexp_function(deadline: Deadline) -> Callable[[str | None, Any], int | None]:
    def check() -> None:
        if time.monotonic() > deadline.at:
            deadline.expired = True
            raise RegexTimeout("regex filter ran past the statement deadline")

    def regexp(pattern: str | None, value: Any) -> int | None:
        if pattern is None or value is None:
            return None
        check()
        return 1 if matcher(pattern)(str(value), check) else 0

    return regexp


def install(conn: sqlite3.Connection, deadline: Deadline) -> None:
    function = regexp_function(deadline)
    keep_interrupts(function)  # a Ctrl-C in it is given back (``sqlite_interrupts``)
    conn.create_function("regexp", 2, function, deterministic=True)


def install_on_engine(engine: sa.Engine, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Give every connection of a SQLite ``engine`` the ``REGEXP`` function, each
    statement ``timeout`` seconds of matching. Call it before the engine's first
    connection (``cellsight.cells.database.create_engine`` then this); other dialects: no-op."""
    if engine.dialect.name != "sqlite" or engine in _INSTALLED:
        return
    _INSTALLED.add(engine)  # once per engine: listeners would stack

    @event.listens_for(engine, "before_cursor_execute")
    def _arm(conn: sa.Connection, *args: Any) -> None:
        # Installed on a connection's first statement, not at connect: the engine may
        # already have pooled connections when this is called.
        record = conn.connection
        deadline = record.info.get("regexp_deadline")
        if deadline is None:
            deadline = record.info["regexp_deadline"] = Deadline()
            raw = record.dbapi_connection
            assert isinstance(raw, sqlite3.Connection)
            install(raw, deadline)
        deadline.arm(timeout)

    @event.listens_for(engine, "handle_error")
    def _timed_out(context: sa.engine.ExceptionContext) -> None:
        conn = context.connection
        if conn is None or conn.invalidated:
            return
        deadline = conn.connection.info.get("regexp_deadline")
        if deadline is not None and deadline.expired:
            deadline.expired = False  # this statement's: never a later error's
            raise RegexDeadline("regex filter ran past the statement deadline")
