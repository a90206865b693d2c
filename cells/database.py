"""Engines for the API and cell databases: URL validation, one cache, connections.

Supported: SQLite (default, files), PostgreSQL through psycopg 3, MariaDB/MySQL
through PyMySQL. A URL naming only the backend (``postgresql://``, ``mysql://``,
``mariadb://``) gets that driver, since SQLAlchemy's defaults (psycopg2, mysqlclient)
are not installed. Each dialect's engine, and how it carries the connect, statement
and lock timeouts, is in ``cellsight.cells.dialects``.

A SQLite engine opens only an existing file (a missing one is ``DatabaseMissing``, not
a new empty database); ``create_database`` is how a SQLite database comes to exist.
"""

from __future__ import annotations

import logging
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import sqlalchemy as sa
from sqlalchemy import event

from cellsight.cells.dialects import (
    Timeouts,
    mysql_engine,
    postgresql_engine,
    sqlite_engine,
    sqlite_error_code,
    sqlite_path,
)
from cellsight.cells.errors import (
    USERINFO,
    BadDatabaseURL,
    DatabaseUnavailable,
    LockWaitTimeout,
    TransactionConflict,
    safe_url,
)
from cellsight.sqlite_storage import explained

T = TypeVar("T")

DRIVERS = {
    "sqlite": "sqlite+pysqlite",
    "postgresql": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
}
ALLOWED_DRIVERS = {
    "sqlite": {"pysqlite"},
    "postgresql": {"psycopg"},
    "mysql": {"pymysql"},
    "mariadb": {"pymysql"},
}

log = logging.getLogger(__name__)


def parse_url(url: str) -> sa.URL:
    """Validate a database URL and pick our driver; raise ``BadDatabaseURL`` saying why."""
    if not isinstance(url, str) or not url.strip():
        raise BadDatabaseURL(str(url), "empty URL")
    try:
        parsed = sa.make_url(url.strip())
    except sa.exc.ArgumentError:
        raise BadDatabaseURL(url, "not a URL of the form dialect[+driver]://…") from None
    except ValueError:  # SQLAlchemy's int() of what it took for the port
        raise BadDatabaseURL(url, _host_or_port_problem(url)) from None
    if parsed.port is not None and not 0 <= parsed.port <= 65535:
        # SQLAlchemy takes any integer: the driver refused it later, as a server down.
        raise BadDatabaseURL(url, "Port out of range 0-65535")
    backend = parsed.get_backend_name()
    if backend not in DRIVERS:
        raise BadDatabaseURL(
            url, f"unsupported database {backend!r} (use sqlite, postgresql, mysql or mariadb)"
        )
    driver = parsed.get_driver_name() if "+" in parsed.drivername else None
    if driver is None:
        parsed = parsed.set(drivername=DRIVERS[backend])
    elif driver not in ALLOWED_DRIVERS[backend]:
        wanted = " or ".join(sorted(ALLOWED_DRIVERS[backend]))
        raise BadDatabaseURL(
            url, f"driver {driver!r} is not supported for {backend} (use {wanted})"
        )
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:") or (parsed.database or "").startswith(
            "file::memory:"
        ):
            raise BadDatabaseURL(
                url,
                "an in-memory SQLite database is private to one connection; "
                "give a file path (sqlite:///path/to/cell.db)",
            )
        if not (parsed.database or "").startswith("file:"):
            # Stored in the API database and used from any working directory later.
            parsed = parsed.set(database=str(Path(parsed.database or "").resolve()))
    elif not parsed.database:
        raise BadDatabaseURL(url, "no database name (…/DBNAME at the end)")
    if backend in ("mysql", "mariadb") and "charset" not in parsed.query:
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    return parsed


def sqlite_file(parsed: sa.URL) -> Path | None:
    """The file a parsed SQLite URL names; None for other databases and for ``file:``
    URIs, which name theirs in their own way."""
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database.startswith("file:"):
        return None
    return Path(database)


def missing_directory(url: str) -> Path | None:
    """The directory a SQLite file URL names that does not exist (None for other URLs,
    ``file:`` URIs, and files whose directory is there). A path in a missing directory
    is a typo more often than not: the commands that would create it ask first."""
    path = sqlite_file(parse_url(url))
    if path is None or path.parent.is_dir():
        return None
    return path.parent


def _host_or_port_problem(url: str) -> str:
    """Why SQLAlchemy could not read ``url``'s host or port, in the words urllib uses
    for the bus and search URLs too ("Invalid IPv6 URL", "Port could not be cast…").
    The user info is cut off first, as SQLAlchemy reads it: never part of a password."""
    scheme, _, rest = url.strip().partition("://")
    if (userinfo := USERINFO.match(rest)) is not None:
        rest = rest[userinfo.end() :]
    try:
        urlsplit(f"{scheme}://{rest}").port  # noqa: B018 - the port is parsed on first use
    except ValueError as exc:
        return str(exc)
    return "the host or port does not parse (a port is a number, an IPv6 host is in [ ])"


def create_engine(url: str | sa.URL, timeouts: Timeouts = Timeouts()) -> sa.Engine:
    """A new engine with the dialect's timeouts (``cellsight.cells.dialects``)."""
    parsed = parse_url(url) if isinstance(url, str) else url
    backend = parsed.get_backend_name()
    try:
        if backend == "sqlite":
            return sqlite_engine(parsed, timeouts)
        if backend == "postgresql":
            return postgresql_engine(parsed, timeouts)
        return mysql_engine(parsed, timeouts)
    except (ImportError, sa.exc.NoSuchModuleError) as exc:
        # The drivers Cellsight supports (psycopg, PyMySQL) are its production extra.
        how = "; pip install 'cellsight[production]'" if backend != "sqlite" else ""
        raise BadDatabaseURL(str(url), f"its driver is not installed ({exc}){how}") from None
    except (TypeError, ValueError) as exc:  # the dialect reads some parameters itself
        raise BadDatabaseURL(str(url), f"a query parameter does not parse ({exc})") from None


@event.listens_for(sa.Engine, "handle_error")
def _name_the_database(context: sa.engine.ExceptionContext) -> None:
    # A driver error does not say which database it came from; operators need to know
    # (the CLI's one-line error shows this note). The type is left unchanged.
    if context.sqlalchemy_exception is not None and context.engine is not None:
        context.sqlalchemy_exception.add_note(f"database {safe_url(context.engine.url)}")


def create_database(url: str | sa.URL, *, connect_timeout: float = 5.0) -> None:
    """Create a missing SQLite database file and its directory; an existing one is
    left as it is.

    Engines never create a database (see ``_sqlite_engine``): only the paths meant to
    make one call this (registering a cell with its tables, seeding, the API database).
    A server database (PostgreSQL, MariaDB) is its operator's to create: nothing to do.
    """
    parsed = parse_url(url) if isinstance(url, str) else url
    if parsed.get_backend_name() != "sqlite":
        return
    engine = sqlite_engine(parsed, Timeouts(connect=connect_timeout), create=True)
    try:
        with connect(engine):
            pass
    finally:
        engine.dispose()


@contextmanager
def connect(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection. A failure to connect becomes ``DatabaseUnavailable``, and so does
    losing the server while the connection is used (SQLAlchemy's dialect marks such an
    error ``connection_invalidated``; a timeout or a bad statement stays what it is)."""
    try:
        conn = engine.connect()
    except sa.exc.DBAPIError as exc:
        raise DatabaseUnavailable(engine.url, unavailable_why(engine.url, exc.orig)) from None
    try:
        # Closing is inside: a server lost after the last statement fails the rollback
        # that ends the connection's implicit transaction.
        with conn:
            yield conn
    except sa.exc.DBAPIError as exc:
        if lock_wait_ran_out(exc.orig):
            raise LockWaitTimeout(engine.url, first_line(exc.orig)) from None
        if not exc.connection_invalidated:
            raise
        raise DatabaseUnavailable(engine.url, unavailable_why(engine.url, exc.orig)) from None


@contextmanager
def write_transaction(engine: sa.Engine) -> Iterator[sa.Connection]:
    """One read-write transaction: committed on exit, rolled back on any exception.

    On SQLite it starts with ``BEGIN IMMEDIATE``, taking the write lock up front, so a
    read-then-write transaction cannot fail half-way on a lock upgrade.
    """
    with connect(engine) as conn:
        if engine.dialect.name == "sqlite":
            conn = conn.execution_options(sqlite_begin="IMMEDIATE")
        try:
            with conn.begin():
                yield conn
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            if _conflict(exc.orig):
                raise TransactionConflict(engine.url, first_line(exc.orig)) from None
            if lock_wait_ran_out(exc.orig):
                raise LockWaitTimeout(engine.url, first_line(exc.orig)) from None
            # The server went away (or SQLite stayed locked) mid-transaction; whether a
            # failed COMMIT applied is unknown, as for any lost connection.
            raise DatabaseUnavailable(engine.url, unavailable_why(engine.url, exc.orig)) from None


# Rolled back by the server to break a deadlock, or not serializable: by SQLSTATE
# (PostgreSQL's 40P01 and 40001) or MySQL's error number (1213), never by message text.
_CONFLICT_STATES = frozenset({"40P01", "40001"})
_MYSQL_DEADLOCK = 1213
CONFLICT_TRIES = 4


# A lock wait that ran out: PostgreSQL's lock_timeout (SQLSTATE 55P03), MySQL's 1205 (both
# its lock wait timeouts), SQLite's busy timeout (SQLITE_BUSY, the primary code).
_LOCK_NOT_AVAILABLE = "55P03"
_MYSQL_LOCK_WAIT = 1205


def _driver_says(
    orig: BaseException | None,
    *,
    sqlstates: frozenset[str] = frozenset(),
    sqlite: int | None = None,
    mysql: int | None = None,
) -> bool:
    """Whether a driver error is one of these: PostgreSQL's SQLSTATEs, SQLite's primary
    result code, MySQL's error number (each by code, never by message text)."""
    if getattr(orig, "sqlstate", None) in sqlstates:
        return True
    if isinstance(orig, sqlite3.Error):
        return sqlite is not None and sqlite_error_code(orig) == sqlite
    args: tuple[Any, ...] = getattr(orig, "args", ())
    return bool(args) and mysql is not None and args[0] == mysql


def connection_dropped(exc: sa.exc.DBAPIError) -> bool:
    """Whether the server closed the connection under a statement (a failover, an
    administrator's ``pg_terminate_backend`` or ``KILL``), so that a new connection may
    serve at once. Not a connection left for want of an answer (PyMySQL's socket
    timeout, ``NoAnswer``): asking again would wait as long again."""
    if not exc.connection_invalidated:
        return False
    orig = exc.orig
    if orig is None or isinstance(orig, TimeoutError) or isinstance(orig.__context__, TimeoutError):
        return False
    try:
        from cellsight.cells.answer_bound import NoAnswer
    except ImportError:  # no psycopg: no PostgreSQL connection either
        return True
    return not isinstance(orig, NoAnswer)


def lock_wait_ran_out(orig: BaseException | None) -> bool:
    return _driver_says(
        orig,
        sqlstates=frozenset({_LOCK_NOT_AVAILABLE}),
        sqlite=sqlite3.SQLITE_BUSY,
        mysql=_MYSQL_LOCK_WAIT,
    )


_UNDEFINED_TABLE = "42P01"  # PostgreSQL
_MYSQL_NO_SUCH_TABLE = 1146


def table_missing(orig: BaseException | None) -> bool:
    """Whether a driver error may be a table that is not there: SQLite's generic error
    (its "no such table" has no code of its own), PostgreSQL's 42P01, MySQL's 1146."""
    return _driver_says(
        orig,
        sqlstates=frozenset({_UNDEFINED_TABLE}),
        sqlite=sqlite3.SQLITE_ERROR,
        mysql=_MYSQL_NO_SUCH_TABLE,
    )


def _conflict(orig: BaseException | None) -> bool:
    return _driver_says(orig, sqlstates=_CONFLICT_STATES, mysql=_MYSQL_DEADLOCK)


def retry_conflicts(fn: Callable[[], T]) -> T:
    """``fn()`` (one write transaction and what it decides), run again when the database
    rolled it back as a deadlock's victim: up to ``CONFLICT_TRIES`` times, after a short
    random pause so that the transactions that met do not meet again."""
    for attempt in range(1, CONFLICT_TRIES + 1):
        try:
            return fn()
        except TransactionConflict as exc:
            if attempt == CONFLICT_TRIES:
                raise
            log.info(
                "database %r rolled a transaction back (%s): running it again", exc.url, exc.why
            )
            time.sleep(random.uniform(0.0, 0.02 * attempt))
    raise AssertionError("unreachable")


def unavailable_why(url: str | sa.URL, orig: BaseException | None) -> str:
    """The driver's first line; for a SQLite file's storage error, what its file system
    says after it (SQLite's "disk I/O error" was all a cell on a full disk said)."""
    why = first_line(orig)
    state = None if orig is None else explained(orig, sqlite_path(sa.make_url(url)))
    return f"{why} ({state})" if state else why


def first_line(exc: BaseException | None) -> str:
    text = str(exc).strip() if exc is not None else "unknown error"
    return text.splitlines()[0] if text else type(exc).__name__


class Engines:
    """The one cache of engines, keyed by normalised URL; all share the same timeouts."""

    def __init__(
        self,
        *,
        connect_timeout: float = 5.0,
        statement_timeout: float | None = None,
        lock_timeout: float | None = None,
    ) -> None:
        self.timeouts = Timeouts(connect_timeout, statement_timeout, lock_timeout)
        self._engines: dict[str, sa.Engine] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, timeouts: Timeouts) -> Engines:
        """Engines with another cache's timeouts (a worker process's, say)."""
        return cls(
            connect_timeout=timeouts.connect,
            statement_timeout=timeouts.statement,
            lock_timeout=timeouts.lock,
        )

    def get(self, url: str) -> sa.Engine:
        parsed = parse_url(url)
        key = parsed.render_as_string(hide_password=False)
        with self._lock:
            engine = self._engines.get(key)
            if engine is None:
                engine = create_engine(parsed, self.timeouts)
                self._engines[key] = engine
            return engine

    def dispose(self) -> None:
        with self._lock:
            for engine in self._engines.values():
                engine.dispose()
            self._engines.clear()
