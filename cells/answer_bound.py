"""A bound on how long a PostgreSQL connection waits for its server to answer.

A server that stops answering without closing its connections (a frozen host or
process, a proxy that stops forwarding) is not noticed by anything else: psycopg waits
for data with no timeout, ``statement_timeout`` is the frozen server's to enforce, and
TCP keepalives and ``tcp_user_timeout`` are answered by the peer's kernel. So every call
of the engine's dialect that waits on the server (execute, commit, rollback, the pool's
ping and reset, a new connection's ``initialize``; an executemany gets the bound once per
``ROWS_PER_BOUND`` rows) is watched: past its bound one process-wide thread shuts the
connection's socket down, the wait ends in psycopg's own "server closed the connection"
(a disconnect: SQLAlchemy invalidates the connection), and that error is re-raised as
``NoAnswer``, a psycopg ``OperationalError`` naming the bound.

MariaDB needs none of this: PyMySQL's ``read_timeout`` bounds each socket read, the
handshake's included (``cellsight.cells.dialects``). SQLite has no server.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from itertools import count
from typing import Any

import psycopg
import sqlalchemy as sa

log = logging.getLogger(__name__)
# An executemany (a seed's chunk, a sync's rows) is one call of the driver, pipelined:
# it gets the bound once per this many rows, as if each were a statement of its own.
ROWS_PER_BOUND = 1000


class NoAnswer(psycopg.OperationalError):
    """The server did not answer within the bound; its connection was dropped."""


class _Ticket:
    __slots__ = ("drop", "fired")

    def __init__(self, drop: Callable[[], None]) -> None:
        self.drop = drop
        self.fired = False


class Watchdog:
    """Deadlines for waits on servers: ``arm`` before a wait, ``disarm`` after it; one
    that is still armed at its deadline has its ``drop`` called, on the watchdog's own
    thread. Tickets of one bound are due in the order they were armed, so each bound is
    a FIFO: arming and disarming are O(1) however many waits are in flight."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._reset()
        # Cellsight's own worker processes are spawned; a forked child (a library's, a
        # caller's) would inherit a lock and a thread that are not its own.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[float, OrderedDict[int, tuple[float, _Ticket]]] = {}
        self._ids = count()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float, drop: Callable[[], None]) -> tuple[float, int, _Ticket]:
        ticket = _Ticket(drop)
        key = next(self._ids)
        with self._cond:
            queue = self._due.setdefault(seconds, OrderedDict())
            queue[key] = (self.clock() + seconds, ticket)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="answer-bound", daemon=True)
                self._thread.start()
            elif len(queue) == 1:
                self._cond.notify()  # the thread may sleep past this deadline
        return seconds, key, ticket

    def disarm(self, armed: tuple[float, int, _Ticket]) -> bool:
        """Whether the deadline had passed and ``drop`` was called."""
        seconds, key, ticket = armed
        with self._cond:
            # Under the lock: once this returns, ``drop`` cannot run for this ticket (the
            # connection may be closed and its descriptor reused).
            self._due[seconds].pop(key, None)
            return ticket.fired

    @contextlib.contextmanager
    def watching(self, seconds: float, drop: Callable[[], None]) -> Iterator[None]:
        armed = self.arm(seconds, drop)
        try:
            yield
        except psycopg.OperationalError as exc:
            if self.disarm(armed):
                raise NoAnswer(f"no answer from the server in {seconds:g} s") from exc
            raise
        except BaseException:
            self.disarm(armed)
            raise
        self.disarm(armed)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = self.clock()
                nearest: float | None = None
                for queue in self._due.values():
                    while queue:
                        deadline, ticket = next(iter(queue.values()))
                        if deadline > now:
                            nearest = deadline if nearest is None else min(nearest, deadline)
                            break
                        queue.popitem(last=False)
                        ticket.fired = True
                        try:
                            ticket.drop()
                        except Exception:
                            # Gone already (libpq lost it: "the connection is lost"):
                            # nothing to drop. This thread must not die: the other
                            # deadlines stand.
                            log.debug("dropping a connection past its bound", exc_info=True)
                self._cond.wait(None if nearest is None else nearest - now)


WATCHDOG = Watchdog()


def _shut_down(dbapi_connection: Any) -> Callable[[], None]:
    def drop() -> None:
        # A duplicate of libpq's descriptor: shutdown acts on the socket both share,
        # so libpq's wait wakes to end-of-file; closing the duplicate leaves libpq's.
        with socket.socket(fileno=os.dup(dbapi_connection.pgconn.socket)) as sock:
            sock.shutdown(socket.SHUT_RDWR)

    return drop


def bound_answers(engine: sa.Engine, seconds: float) -> None:
    """Watch every wait on ``engine``'s servers for ``seconds``.

    The dialect's methods are wrapped on this engine's own dialect instance (the pool
    calls the same instance for its ping and reset), so other engines are untouched.
    """
    dialect: Any = engine.dialect

    def on_cursor(name: str) -> None:
        method = getattr(dialect, name)

        def watched(cursor: Any, *args: Any, **kwargs: Any) -> Any:
            with WATCHDOG.watching(seconds, _shut_down(cursor.connection)):
                return method(cursor, *args, **kwargs)

        setattr(dialect, name, watched)

    executemany = dialect.do_executemany

    def watched_many(cursor: Any, statement: Any, parameters: Any, *args: Any) -> Any:
        bound = seconds * max(1, math.ceil(len(parameters) / ROWS_PER_BOUND))
        with WATCHDOG.watching(bound, _shut_down(cursor.connection)):
            return executemany(cursor, statement, parameters, *args)

    dialect.do_executemany = watched_many

    # A new connection's first queries (the server's version and settings, the hstore
    # type's lookup) are run by ``initialize`` on the driver's own cursor, unwrapped.
    initialize = dialect.initialize

    def watched_initialize(connection: Any) -> None:
        dbapi_connection = connection.connection.dbapi_connection
        with WATCHDOG.watching(seconds, _shut_down(dbapi_connection)):
            initialize(connection)

    dialect.initialize = watched_initialize

    def on_connection(name: str) -> None:
        method = getattr(dialect, name)

        def watched(dbapi_connection: Any, *args: Any, **kwargs: Any) -> Any:
            with WATCHDOG.watching(seconds, _shut_down(dbapi_connection)):
                return method(dbapi_connection, *args, **kwargs)

        setattr(dialect, name, watched)

    for name in ("do_execute", "do_execute_no_params"):
        on_cursor(name)
    for name in ("do_commit", "do_rollback", "do_ping", "get_isolation_level"):
        on_connection(name)
