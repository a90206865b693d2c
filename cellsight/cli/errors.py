"""The CLI boundary: every failure becomes one line and an exit code, in one place.

Exit codes, the one convention every command follows:

====  ==========================================================================
0     done
1     runtime: a bus, search engine or database failed, refused or lacks its
      tables; an operation was refused; verify left drift
2     usage: a bad option, value, URL or configuration, or a name that is unknown
      or already taken (a cell, a flavor, an instance uuid)
3     another sync, verify or purge of the same type holds the lock
130   interrupted (Ctrl-C or SIGTERM), cleaned up; a SIGTERM before the command
      has begun (while it is imported) ends it by the signal, 143, as a
      service manager expects, with nothing to clean up
141   the reader of stdout went away (``| head``): stopped quietly, 128 + SIGPIPE
      (``cellsight.cli.pipes``)
====  ==========================================================================

Errors are classified by type, never by message text. The named errors of each
package already name what failed (database URLs and engine URLs with passwords
masked); driver errors that reach this far are named here. ``--debug`` shows the
traceback instead.
"""

from __future__ import annotations

from typing import Any

DONE = 0
RUNTIME = 1
USAGE = 2
LOCKED = 3
INTERRUPTED = 130
CLOSED_PIPE = 141


def _first_line(value: object) -> str:
    text = str(value).strip()
    return text.splitlines()[0] if text else type(value).__name__


def _database(exc: Any) -> str:
    from cellsight.cells.database import table_missing  # the failure path only

    # ``cellsight.cells.database`` notes which database a driver error came from (masked).
    notes = [n for n in getattr(exc, "__notes__", ()) if n.startswith("database ")]
    where = notes[0] if notes else "database"
    orig = getattr(exc, "orig", None)
    why = f"{type(orig).__name__}: {_first_line(orig)}" if orig is not None else _first_line(exc)
    if not table_missing(orig):
        return f"{where}: {why}"  # a full disk, a lock: the hint below would mislead
    hint = "a missing table means it is not a cell database yet: `cellsight cells add` creates them"
    return f"{where}: {why} ({hint})"


def describe(exc: BaseException, bus_url: str | None = None) -> tuple[int, str]:
    """The exit code and the one line for ``exc``; unknown errors are ``internal``."""
    if isinstance(exc, KeyboardInterrupt):
        # Before any import: the interrupt may have landed in one of them, and importing
        # a half-imported package again failed with a traceback (an interrupt probe).
        # An interrupt raised by a command says what it had done (SeedInterrupted).
        return INTERRUPTED, str(exc) or "interrupted"
    # Imported here, on the failure path only, so that starting the CLI stays quick.
    import pydantic
    import sqlalchemy.exc

    from cellsight.cells.errors import (
        BadDatabaseURL,
        BlankText,
        CellsError,
        DuplicateCell,
        DuplicateInstance,
        InstanceNotFound,
        InvalidTag,
        InvalidText,
        TextTooLong,
        UnknownCell,
        UnknownFlavor,
    )
    from cellsight.cells.nodeevents import ComputeNodeNotFound
    from cellsight.cells.nodes import DuplicateHost
    from cellsight.clients import BadBusURL
    from cellsight.indexer.engines import UnsupportedEngineURL
    from cellsight.indexer.engines.base import EngineError
    from cellsight.indexer.lock import LockHeld
    from cellsight.indexer.write_process import WriterProcessFailed
    from cellsight.notifications.embedded import BusError
    from cellsight.notifications.errors import NotificationError
    from cellsight.settings import ConfigError

    if isinstance(exc, ConfigError | BadBusURL | BadDatabaseURL | UnsupportedEngineURL):
        return USAGE, _first_line(exc)
    if isinstance(exc, pydantic.ValidationError):
        error = exc.errors()[0]
        field = ".".join(str(p) for p in error["loc"]) or exc.title
        return USAGE, f"{field}: {error['msg']}"
    if isinstance(exc, LockHeld):
        return LOCKED, _first_line(exc)
    named = (
        UnknownCell,
        DuplicateCell,
        DuplicateHost,
        ComputeNodeNotFound,  # as a duplicate host is: a name the operator gave
        DuplicateInstance,  # a uuid already taken, as the exit codes' table says
        UnknownFlavor,
        InstanceNotFound,
        InvalidText,
        BlankText,
        TextTooLong,
        InvalidTag,
    )
    if isinstance(exc, named):
        return USAGE, exc.message
    if isinstance(exc, CellsError | NotificationError):
        return RUNTIME, exc.message
    if isinstance(exc, EngineError | BusError | WriterProcessFailed):
        return RUNTIME, _first_line(exc)
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        return RUNTIME, _database(exc)
    bus = _bus_error(exc, bus_url)
    if bus is not None:
        return RUNTIME, bus
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return RUNTIME, f"{where}{exc.strerror or _first_line(exc)}"
    return RUNTIME, (
        f"internal error: {type(exc).__name__}: {_first_line(exc)} "
        "(run with --debug for the traceback)"
    )


def _bus_error(exc: BaseException, bus_url: str | None) -> str | None:
    """A broker error that escaped ``cellsight.clients.bus_connection`` (mid-command)."""
    import kombu.exceptions

    from cellsight.urls import redact_url

    kinds: list[type[BaseException]] = [kombu.exceptions.KombuError]
    try:
        import amqp.exceptions

        kinds.append(amqp.exceptions.AMQPError)
    except ImportError:  # pragma: no cover - amqp comes with kombu
        pass
    try:
        import redis.exceptions

        kinds.append(redis.exceptions.RedisError)
    except ImportError:  # pragma: no cover - redis is a runtime dependency
        pass
    if isinstance(exc, tuple(kinds)):
        where = f"message bus {redact_url(bus_url)}" if bus_url else "the embedded message bus"
        return f"{where}: {type(exc).__name__}: {_first_line(exc)}"
    return None
