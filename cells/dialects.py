"""Each dialect's engine: its driver's connect arguments and the session settings that
carry ``Timeouts`` (see ``cellsight.cells.database``, which picks the dialect).

* ``connect``: each connect. ``statement`` (``None``: no limit): each statement,
  enforced by the server or driver so a slow cell cannot hold a caller past its
  deadline: PostgreSQL ``statement_timeout``; MariaDB ``max_statement_time`` (MySQL
  ``max_execution_time``, SELECTs only) plus PyMySQL's socket read/write timeouts;
  SQLite a progress handler that interrupts the statement. A server that does not
  answer at all is left a moment later: PyMySQL's socket timeouts, and for PostgreSQL
  a watchdog that drops the connection (``cellsight.cells.answer_bound``).
* ``lock`` (``None``: the server's default): how long a statement waits for a lock
  another session holds (a migration's ``ALTER TABLE``, a ``LOCK TABLE``) before it
  fails, so that a command reading the cells reports the cell instead of waiting as
  long as the lock is held: PostgreSQL ``lock_timeout`` (its default waits forever);
  MariaDB/MySQL ``lock_wait_timeout`` (metadata locks; a day by default) and
  ``innodb_lock_wait_timeout`` (rows), whole seconds; SQLite's busy timeout.
"""

from __future__ import annotations

import math
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import ConnectionPoolEntry

from cellsight.cells.errors import DatabaseMissing, DatabaseUnavailable, DriverRefusedURL
from cellsight.sqlite_interrupts import keep_interrupts, signalled
from cellsight.sqlite_pragmas import apply_pragma

SQLITE_BUSY_MS = 10_000  # without a lock timeout
# The progress handler runs every this many SQLite VM steps: cheap, yet fine-grained.
SQLITE_PROGRESS_STEPS = 10_000


@dataclass(frozen=True)
class Timeouts:
    """Seconds; plain values, so that a sync's worker process can take them."""

    connect: float = 5.0
    statement: float | None = None
    lock: float | None = None


# SQLAlchemy's compiled-statement cache, per engine, so per cell: its default (500
# entries, pruned past 750) let the API grow by ~30 MB a cell under listings of many
# sort and filter shapes (an adversarial probe: 10 cells, 804 MB and still growing).
# Measured on the fan-out's instance select: 39.4 KiB a cached shape; a miss recompiles
# it, 1.6 ms (2.30 against 0.74 ms an execute). The shapes a cluster's clients send
# often are few, so 64 keep the hits: at most 96 entries, ~4 MB a cell.
QUERY_CACHE_SIZE = 64
# Bytes of a value ORDER BY compares on MariaDB and MySQL: a TEXT column's most, so the
# whole of any sortable value. (Their largest setting, 8 MiB, left a sort of such keys
# "out of sort memory" in the default 2 MiB sort buffer.)
MAX_SORT_LENGTH = 65_535


def _milliseconds(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _whole_seconds(seconds: float) -> int:
    return max(1, math.ceil(seconds))


def backstop(statement: float) -> int:
    """The client's bound for a statement the server should have cancelled at
    ``statement`` seconds: a moment later, in the whole seconds PyMySQL takes."""
    return _whole_seconds(statement + 1)


def sqlite_engine(url: sa.URL, timeouts: Timeouts, *, create: bool = False) -> sa.Engine:
    engine = sa.create_engine(
        url, connect_args={"timeout": timeouts.connect}, query_cache_size=QUERY_CACHE_SIZE
    )

    @event.listens_for(engine, "do_connect")
    def _open(
        dialect: sa.Dialect, record: ConnectionPoolEntry, cargs: list[Any], cparams: dict[str, Any]
    ) -> DBAPIConnection | None:
        # sqlite3 creates a missing file by default: a typo or a moved cell file would
        # become an empty cell. Open with mode=rw (fails instead) unless creating.
        target = sqlite_file_uri(cargs[0], bool(cparams.get("uri")))
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
            if sqlite_error_code(exc) == sqlite3.SQLITE_CANTOPEN and not path.exists():
                raise DatabaseMissing(url, path) from None
            raise
        return conn

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, record: ConnectionPoolEntry) -> None:
        # Take transaction control from the sqlite3 module so that BEGIN is ours
        # (IMMEDIATE for writes, see write_transaction).
        dbapi_conn.isolation_level = None
        busy = SQLITE_BUSY_MS if timeouts.lock is None else _milliseconds(timeouts.lock)
        # Commands opening a new file at once: SQLite does not wait for this one's lock.
        apply_pragma(dbapi_conn, "PRAGMA journal_mode=WAL", busy / 1000)
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={busy}")
        cursor.close()
        keep_interrupts()
        if timeouts.statement is not None:
            record.info["deadline"] = math.inf
            dbapi_conn.set_progress_handler(
                lambda: time.monotonic() > record.info["deadline"], SQLITE_PROGRESS_STEPS
            )

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    @event.listens_for(engine, "handle_error")
    def _signalled(context: sa.engine.ExceptionContext) -> BaseException | None:
        if signalled(context.original_exception, _deadline(context.connection)):
            return KeyboardInterrupt()
        return None

    statement = timeouts.statement
    if statement is not None:

        @event.listens_for(engine, "before_cursor_execute")
        def _arm(conn: sa.Connection, *args: Any) -> None:
            conn.connection.info["deadline"] = time.monotonic() + statement

        # Results are fetched lazily, so the deadline holds until the transaction ends;
        # disarmed before COMMIT so that a commit is never interrupted.
        for name in ("commit", "rollback"):

            @event.listens_for(engine, name)
            def _disarm(conn: sa.Connection, *args: Any) -> None:
                # An invalidated connection (an interrupt inside a statement) has no
                # driver connection left to disarm; asking for it raised
                # PendingRollbackError from the rollback, in place of the interrupt.
                if not conn.invalidated:
                    conn.connection.info["deadline"] = math.inf

    return engine


def _deadline(conn: sa.Connection | None) -> float:
    if conn is None or conn.invalidated:
        return -math.inf
    return float(conn.connection.info.get("deadline", -math.inf))


def sqlite_file_uri(filename: str, uri: bool) -> tuple[str, Path] | None:
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


def sqlite_path(url: sa.URL) -> Path | None:
    """The file a SQLite URL names, or None (another dialect, an in-memory database)."""
    if url.get_backend_name() != "sqlite" or not url.database:
        return None
    target = sqlite_file_uri(url.database, str(url.query.get("uri", "")).lower() == "true")
    return None if target is None else target[1]


def sqlite_error_code(exc: sqlite3.Error) -> int | None:
    """The primary result code (``sqlite_errorcode`` is the extended one: its low byte)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def _driver_arguments_named(engine: sa.Engine) -> sa.Engine:
    """A URL's query parameters reach the driver's ``connect`` as keywords; one it does
    not take (``?bogus=1``: a TypeError, psycopg's ProgrammingError) or a file it names
    that is not there
    (``?ssl_ca=/nope``) ended a command as an internal error, or as a bare "No such
    file or directory", naming neither the URL nor the parameter."""

    @event.listens_for(engine, "do_connect")
    def _connect(
        dialect: sa.Dialect, record: ConnectionPoolEntry, cargs: list[Any], cparams: dict[str, Any]
    ) -> DBAPIConnection:
        try:
            return dialect.connect(*cargs, **cparams)
        except TypeError as exc:
            why = f"its driver refuses a query parameter ({exc})"
        except dialect.loaded_dbapi.ProgrammingError as exc:
            # Before any statement: libpq's "invalid connection option" (psycopg).
            why = f"its driver refuses a query parameter ({str(exc).strip()})"
        except FileNotFoundError as exc:
            why = "a file a query parameter names does not exist" + (
                f" ({exc.filename})" if exc.filename else ""
            )
        raise DriverRefusedURL(engine.url, why) from None

    return engine


def postgresql_engine(url: sa.URL, timeouts: Timeouts) -> sa.Engine:
    # libpq takes whole seconds and treats values below 2 as 2.
    connect_args: dict[str, Any] = {"connect_timeout": max(2, math.ceil(timeouts.connect))}
    options = ["-c timezone=UTC"]
    if timeouts.statement is not None:
        options.append(f"-c statement_timeout={_milliseconds(timeouts.statement)}")
    if timeouts.lock is not None:
        options.append(f"-c lock_timeout={_milliseconds(timeouts.lock)}")
    connect_args["options"] = " ".join(options)
    engine = _driver_arguments_named(
        sa.create_engine(
            url,
            connect_args=connect_args,
            pool_pre_ping=True,
            query_cache_size=QUERY_CACHE_SIZE,
        )
    )
    if timeouts.statement is not None:
        # Here, not at the top: psycopg is the production extra's.
        from cellsight.cells.answer_bound import bound_answers

        bound_answers(engine, backstop(timeouts.statement))
    return engine


def mysql_engine(url: sa.URL, timeouts: Timeouts) -> sa.Engine:
    connect_args: dict[str, Any] = {"connect_timeout": _whole_seconds(timeouts.connect)}
    if timeouts.statement is not None:
        # The socket timeout is the backstop (also of the handshake, which the connect
        # timeout does not cover); give the server a moment to cancel first.
        socket_timeout = backstop(timeouts.statement)
        connect_args["read_timeout"] = socket_timeout
        connect_args["write_timeout"] = socket_timeout
    # READ COMMITTED, as PostgreSQL's default: InnoDB's REPEATABLE READ takes gap locks on
    # index searches, so a boot inserting an instance beside one a delete had locked
    # waited on the delete, which waited on the boot's host (a deadlock in about one boot
    # in twenty at six at once). Every transaction here locks what it reads explicitly.
    engine = _driver_arguments_named(
        sa.create_engine(
            url,
            connect_args=connect_args,
            pool_pre_ping=True,
            pool_recycle=3600,
            isolation_level="READ COMMITTED",
            query_cache_size=QUERY_CACHE_SIZE,
        )
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: ConnectionPoolEntry) -> None:
        cursor = dbapi_conn.cursor()
        cursor.execute("SET SESSION time_zone = '+00:00'")
        # ORDER BY compares the first max_sort_length bytes only (1,024 by default): two
        # descriptions alike that far tied, and a listing sorted by them came out of order
        # and lost servers between its pages.
        cursor.execute(f"SET SESSION max_sort_length = {MAX_SORT_LENGTH}")
        if timeouts.statement is not None:
            if "mariadb" in dbapi_conn.get_server_info().lower():
                cursor.execute(f"SET SESSION max_statement_time = {timeouts.statement:.3f}")
            else:
                limit = _milliseconds(timeouts.statement)
                cursor.execute(f"SET SESSION max_execution_time = {limit}")
        if timeouts.lock is not None:
            wait = _whole_seconds(timeouts.lock)
            cursor.execute(
                f"SET SESSION lock_wait_timeout = {wait}, innodb_lock_wait_timeout = {wait}"
            )
        cursor.close()

    return engine
