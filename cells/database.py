"""Engines for the API and cell databases: URL validation, timeouts, one cache.

Supported: SQLite (default, files), PostgreSQL through psycopg 3, MariaDB/MySQL
through PyMySQL. A URL naming only the backend (``postgresql://``, ``mysql://``,
``mariadb://``) gets that driver, since SQLAlchemy's defaults (psycopg2, mysqlclient)
are not installed.

Timeouts: ``connect_timeout`` bounds each connect; ``statement_timeout`` (``None``: no
limit) bounds each statement, enforced by the server or driver so a slow cell cannot
hold a caller past its deadline: PostgreSQL ``statement_timeout``; MariaDB
``max_statement_time`` (MySQL ``max_execution_time``, SELECTs only) plus PyMySQL's
socket read/write timeouts; SQLite a progress handler that interrupts the statement.

A SQLite engine opens only an existing file (a missing one is ``DatabaseMissing``, not
a new empty database); ``create_database`` is how a SQLite database comes to exist.
"""

from __future__ import annotations

import logging
import math
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import ConnectionPoolEntry

from cellsight.cells.errors import (
    USERINFO,
    BadDatabaseURL,
    DatabaseMissing,
    DatabaseUnavailable,
    TransactionConflict,
    safe_url,
)

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

SQLITE_BUSY_MS = 10_000
# The progress handler runs every this many SQLite VM steps: cheap, yet fine-grained.
SQLITE_PROGRESS_STEPS = 10_000

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


def create_engine(
    url: str | sa.URL, *, connect_timeout: float = 5.0, statement_timeout: float | None = None
) -> sa.Engine:
    """A new engine with the dialect's timeouts; see the module doc."""
    parsed = parse_url(url) if isinstance(url, str) else url
    backend = parsed.get_backend_name()
    try:
        if backend == "sqlite":
            return _sqlite_engine(parsed, connect_timeout, statement_timeout)
        if backend == "postgresql":
            return _postgresql_engine(parsed, connect_timeout, statement_timeout)
        return _mysql_engine(parsed, connect_timeout, statement_timeout)
    except (ImportError, sa.exc.NoSuchModuleError) as exc:
        raise BadDatabaseURL(str(url), f"its driver is not installed ({exc})") from None


@event.listens_for(sa.Engine, "handle_error")
def _name_the_database(context: sa.engine.ExceptionContext) -> None:
    # A driver error does not say which database it came from; operators need to know
    # (the CLI's one-line error shows this note). The type is left unchanged.
    if context.sqlalchemy_exception is not None and context.engine is not None:
        context.sqlalchemy_exception.add_note(f"database {safe_url(context.engine.url)}")


def _sqlite_engine(
    url: sa.URL, connect_timeout: float, statement_timeout: float | None, *, create: bool = False
) -> sa.Engine:
    engine = sa.create_engine(url, connect_args={"timeout": connect_timeout})

    @event.listens_for(engine, "do_connect")
    def _open(
        dialect: sa.Dialect, record: ConnectionPoolEntry, cargs: list[Any], cparams: dict[str, Any]
    ) -> DBAPIConnection | None:
        # sqlite3 creates a missing file by default: a typo or a moved cell file would
        # become an empty cell. Open with mode=rw (fails instead) unless creating.
        target = _sqlite_file_uri(cargs[0], bool(cparams.get("uri")))
        if target is None:
            return None  # in-memory, or a mode the URL chose itself: as given
        uri, path = target
        if create:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise DatabaseUnavailable(
                    url, f"cannot create directory {path.parent}: {exc.strerror}"
                ) from None
        mode = "rwc" if create else "rw"
        try:
            conn = dialect.connect(
                f"{uri}{'&' if '?' in uri else '?'}mode={mode}",
                *cargs[1:],
                **{**cparams, "uri": True},
            )
        except sqlite3.OperationalError as exc:
            # CANTOPEN also covers a directory or a denied permission: only a path that
            # is not there is the missing database.
            if _error_code(exc) == sqlite3.SQLITE_CANTOPEN and not path.exists():
                raise DatabaseMissing(url, path) from None
            raise
        return conn

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, record: ConnectionPoolEntry) -> None:
        # Take transaction control from the sqlite3 module so that BEGIN is ours
        # (IMMEDIATE for writes, see write_transaction).
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
        cursor.close()
        if statement_timeout is not None:
            record.info["deadline"] = math.inf
            dbapi_conn.set_progress_handler(
                lambda: time.monotonic() > record.info["deadline"], SQLITE_PROGRESS_STEPS
            )

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    if statement_timeout is not None:

        @event.listens_for(engine, "before_cursor_execute")
        def _arm(conn: sa.Connection, *args: Any) -> None:
            conn.connection.info["deadline"] = time.monotonic() + statement_timeout

        # Results are fetched lazily, so the deadline holds until the transaction ends;
        # disarmed before COMMIT so that a commit is never interrupted.
        for name in ("commit", "rollback"):

            @event.listens_for(engine, name)
            def _disarm(conn: sa.Connection, *args: Any) -> None:
                conn.connection.info["deadline"] = math.inf

    return engine


def _sqlite_file_uri(filename: str, uri: bool) -> tuple[str, Path] | None:
    """The ``file:`` URI (without a mode) and the path of the file that
    ``sqlite3.connect(filename, uri=uri)`` opens; ``None`` for an in-memory database or
    a URI that sets its own ``mode`` (the URL's author chose it)."""
    if not uri:
        if filename in ("", ":memory:"):
            return None
        path = Path(filename).absolute()
        return path.as_uri(), path  # as_uri escapes what a URI would misread (?, #, %)
    parts = urlsplit(filename)
    if "mode" in parse_qs(parts.query) or parts.path in ("", ":memory:"):
        return None
    return filename, Path(unquote(parts.path))


def _error_code(exc: sqlite3.Error) -> int | None:
    # sqlite_errorcode is the extended code; its low byte is the primary one.
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


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
    engine = _sqlite_engine(parsed, connect_timeout, None, create=True)
    try:
        with connect(engine):
            pass
    finally:
        engine.dispose()


def _postgresql_engine(
    url: sa.URL, connect_timeout: float, statement_timeout: float | None
) -> sa.Engine:
    # libpq takes whole seconds and treats values below 2 as 2.
    connect_args: dict[str, Any] = {"connect_timeout": max(2, math.ceil(connect_timeout))}
    options = ["-c timezone=UTC"]
    if statement_timeout is not None:
        options.append(f"-c statement_timeout={max(1, int(statement_timeout * 1000))}")
    connect_args["options"] = " ".join(options)
    return sa.create_engine(url, connect_args=connect_args, pool_pre_ping=True)


def _mysql_engine(
    url: sa.URL, connect_timeout: float, statement_timeout: float | None
) -> sa.Engine:
    connect_args: dict[str, Any] = {"connect_timeout": max(1, math.ceil(connect_timeout))}
    if statement_timeout is not None:
        # The socket timeout is the backstop; give the server a moment to cancel first.
        socket_timeout = max(1, math.ceil(statement_timeout + 1))
        connect_args["read_timeout"] = socket_timeout
        connect_args["write_timeout"] = socket_timeout
    # READ COMMITTED, as PostgreSQL's default: InnoDB's REPEATABLE READ takes gap locks on
    # index searches, so a boot inserting an instance beside one a delete had locked
    # waited on the delete, which waited on the boot's host (a deadlock in about one boot
    # in twenty at six at once). Every transaction here locks what it reads explicitly.
    engine = sa.create_engine(
        url,
        connect_args=connect_args,
        pool_pre_ping=True,
        pool_recycle=3600,
        isolation_level="READ COMMITTED",
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: ConnectionPoolEntry) -> None:
        cursor = dbapi_conn.cursor()
        cursor.execute("SET SESSION time_zone = '+00:00'")
        if statement_timeout is not None:
            if "mariadb" in dbapi_conn.get_server_info().lower():
                cursor.execute(f"SET SESSION max_statement_time = {statement_timeout:.3f}")
            else:
                cursor.execute(f"SET SESSION max_execution_time = {int(statement_timeout * 1000)}")
        cursor.close()

    return engine


@contextmanager
def connect(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection. A failure to connect becomes ``DatabaseUnavailable``, and so does
    losing the server while the connection is used (SQLAlchemy's dialect marks such an
    error ``connection_invalidated``; a timeout or a bad statement stays what it is)."""
    try:
        conn = engine.connect()
    except sa.exc.DBAPIError as exc:
        raise DatabaseUnavailable(engine.url, first_line(exc.orig)) from None
    try:
        # Closing is inside: a server lost after the last statement fails the rollback
        # that ends the connection's implicit transaction.
        with conn:
            yield conn
    except sa.exc.DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        raise DatabaseUnavailable(engine.url, first_line(exc.orig)) from None


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
            # The server went away (or SQLite stayed locked) mid-transaction; whether a
            # failed COMMIT applied is unknown, as for any lost connection.
            raise DatabaseUnavailable(engine.url, first_line(exc.orig)) from None


# Rolled back by the server to break a deadlock, or not serializable: by SQLSTATE
# (PostgreSQL's 40P01 and 40001) or MySQL's error number (1213), never by message text.
_CONFLICT_STATES = frozenset({"40P01", "40001"})
_MYSQL_DEADLOCK = 1213
CONFLICT_TRIES = 4


def _conflict(orig: BaseException | None) -> bool:
    if getattr(orig, "sqlstate", None) in _CONFLICT_STATES:
        return True
    args: tuple[Any, ...] = getattr(orig, "args", ())
    return bool(args) and args[0] == _MYSQL_DEADLOCK


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


def first_line(exc: BaseException | None) -> str:
    text = str(exc).strip() if exc is not None else "unknown error"
    return text.splitlines()[0] if text else type(exc).__name__


class Engines:
    """The one cache of engines, keyed by normalised URL; all share the same timeouts."""

    def __init__(
        self, *, connect_timeout: float = 5.0, statement_timeout: float | None = None
    ) -> None:
        self.connect_timeout = connect_timeout
        self.statement_timeout = statement_timeout
        self._engines: dict[str, sa.Engine] = {}
        self._lock = threading.Lock()

    def get(self, url: str) -> sa.Engine:
        parsed = parse_url(url)
        key = parsed.render_as_string(hide_password=False)
        with self._lock:
            engine = self._engines.get(key)
            if engine is None:
                engine = create_engine(
                    parsed,
                    connect_timeout=self.connect_timeout,
                    statement_timeout=self.statement_timeout,
                )
                self._engines[key] = engine
            return engine

    def dispose(self) -> None:
        with self._lock:
            for engine in self._engines.values():
                engine.dispose()
            self._engines.clear()
