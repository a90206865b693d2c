"""A cell's database error → "timeout" or "error", by the driver's exception type (and
its numeric error code where one type covers both), per dialect. Never by message text.

* SQLite: the statement deadline is a progress handler that interrupts the statement;
  the driver raises ``sqlite3.OperationalError`` with ``sqlite_errorcode`` =
  ``SQLITE_INTERRUPT``; ``SQLITE_BUSY``/``SQLITE_LOCKED`` are waits that ran out.
* PostgreSQL (psycopg 3): ``QueryCanceled`` (``statement_timeout``),
  ``LockNotAvailable`` (``lock_timeout``), ``ConnectionTimeout``, and ``NoAnswer``
  (a server that did not answer at all: ``cellsight.cells.answer_bound``).
* MariaDB/MySQL (PyMySQL): error codes 1969 (``max_statement_time`` exceeded), 3024
  (MySQL's ``max_execution_time``), 2013 (lost the connection during a query: the
  socket read timeout), 1205 (lock wait timeout).
* SQLAlchemy's own ``TimeoutError`` (no pooled connection in time).
* ``LockWaitTimeout``: ``cellsight.cells.database.connect`` translated one of the lock
  waits above.

``is_cell_failure`` says whether an exception is the database's at all (driver and
connection errors); anything else is our bug and must not be reported as a down cell.
"""

from __future__ import annotations

import socket
import sqlite3

import sqlalchemy as sa

from cellsight.cells.errors import DatabaseUnavailable, LockWaitTimeout, UnreadableRow

_SQLITE_TIMEOUTS = frozenset({sqlite3.SQLITE_INTERRUPT, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_MYSQL_TIMEOUTS = frozenset({1969, 3024, 2013, 1205})


def _postgres_timeouts() -> tuple[type[BaseException], ...]:
    try:
        from psycopg import errors

        from cellsight.cells.answer_bound import NoAnswer
    except ImportError:  # the production extra is not installed: no PostgreSQL cells
        return ()
    return (errors.QueryCanceled, errors.LockNotAvailable, errors.ConnectionTimeout, NoAnswer)


def _mysql_errors() -> tuple[type[BaseException], ...]:
    try:
        from pymysql import err
    except ImportError:
        return ()
    return (err.MySQLError,)


_PG_TIMEOUTS = _postgres_timeouts()
_MYSQL_ERRORS = _mysql_errors()


def driver_error(exc: BaseException) -> BaseException:
    """The DBAPI exception under SQLAlchemy's wrapper (or ``exc`` itself)."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None:
        return exc.orig
    return exc


# What a cell's database raises when it fails (SQLAlchemy wraps every driver's errors
# in ``DBAPIError``); anything else is a bug of ours.
CELL_FAILURES: tuple[type[BaseException], ...] = (
    sa.exc.DBAPIError,
    sa.exc.TimeoutError,
    DatabaseUnavailable,
    UnreadableRow,
    OSError,
)


# What the API database (cell and instance mappings) raises when it cannot answer: the
# API answers 503 "The API database is unavailable" for any of them, never a 500.
API_DB_FAILURES: tuple[type[BaseException], ...] = (DatabaseUnavailable, sa.exc.SQLAlchemyError)


def is_cell_failure(exc: BaseException) -> bool:
    return isinstance(exc, CELL_FAILURES)


def is_timeout(exc: BaseException) -> bool:
    if isinstance(exc, (sa.exc.TimeoutError, socket.timeout, TimeoutError, LockWaitTimeout)):
        return True
    orig = driver_error(exc)
    if isinstance(orig, sqlite3.Error):
        return getattr(orig, "sqlite_errorcode", None) in _SQLITE_TIMEOUTS
    if _PG_TIMEOUTS and isinstance(orig, _PG_TIMEOUTS):
        return True
    if _MYSQL_ERRORS and isinstance(orig, _MYSQL_ERRORS):
        code = orig.args[0] if orig.args else None
        return code in _MYSQL_TIMEOUTS
    return False


def classify(exc: BaseException) -> str:
    return "timeout" if is_timeout(exc) else "error"
