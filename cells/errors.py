"""Named errors of the cells package.

Each message names the offending value and says why, so the CLI can print it as one
line and an API can return it as is. ``reason`` is a short machine label.
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from pydantic import ValidationError

from cellsight.notifications.errors import MalformedNotification, OutOfRange, brief
from cellsight.notifications.registry import describe_location

# A database URL's user info as SQLAlchemy's grammar reads it: a password runs to the
# first "@" and may hold "/" or ":".
USERINFO = re.compile(r"[^:/]*(?::[^@]*)?@")


def safe_url(url: str | sa.URL) -> str:
    """A database URL fit for messages and logs: the password is masked."""
    if isinstance(url, sa.URL):
        return url.render_as_string(hide_password=True)
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except Exception:
        # Unparseable URLs cannot be split reliably: the user info is found as
        # SQLAlchemy's grammar reads it and its password masked, the rest shown as given.
        scheme, sep, rest = url.partition("://")
        if not sep:
            return url.split("@", 1)[-1] if "@" in url else url
        if (userinfo := USERINFO.match(rest)) is None:
            return f"{scheme}://***@{rest.rpartition('@')[2]}" if "@" in rest else url
        user, colon, _ = rest[: userinfo.end() - 1].partition(":")
        return f"{scheme}://{user}{':***' if colon else ''}@{rest[userinfo.end() :]}"


class CellsError(Exception):
    """Base of every cells error."""

    reason = "cells_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadDatabaseURL(CellsError):
    """A database URL that cannot be used: unparseable, unsupported backend, no driver."""

    reason = "bad_database_url"

    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"database URL {safe_url(url)!r}: {why}")
        self.url = url
        self.why = why


class DatabaseUnavailable(CellsError):
    """The database server could not be reached or refused the connection."""

    reason = "database_unavailable"

    def __init__(self, url: str | sa.URL, why: str) -> None:
        super().__init__(f"database {safe_url(url)!r} is unavailable: {why}")
        self.url = safe_url(url)
        self.why = why


class DriverRefusedURL(DatabaseUnavailable):
    """The driver refused what a URL's query parameters ask of it when connecting (a
    keyword it does not take, a file it names that is missing). Unavailable to whatever
    reads the cell (the API skips it and names it); a usage error where the URL is the
    one just given (``cells add``)."""

    reason = "driver_refused_url"


class CellUnavailable(DatabaseUnavailable):
    """A cell's database that an operation needed could not be reached: named by the
    cell the operator knows, then the database (``cells add-host``, ``ops boot`` and
    ``ops reserve`` named the database only)."""

    def __init__(self, cell: str, cause: DatabaseUnavailable) -> None:
        # The cause's own words (a missing SQLite file says so), after the cell's name.
        CellsError.__init__(self, f"cell {cell}: {cause.message}")
        self.url, self.why, self.cell = cause.url, cause.why, cell


class TransactionConflict(DatabaseUnavailable):
    """The database chose this transaction as a deadlock's victim (or could not serialize
    it) and rolled it back: running it again is the answer (``retry_conflicts``). A kind
    of ``DatabaseUnavailable`` for the callers that do not retry."""

    reason = "transaction_conflict"


class LockWaitTimeout(DatabaseUnavailable):
    """A statement waited out the lock timeout (``CELLSIGHT_DB_LOCK_TIMEOUT``) for a lock
    another session holds on the database's tables: a migration's ``ALTER TABLE``, a
    ``LOCK TABLE``, a long write. The database is up; this command could not wait."""

    reason = "lock_wait_timeout"

    def __init__(self, url: str | sa.URL, why: str) -> None:
        CellsError.__init__(
            self,
            f"database {safe_url(url)!r} is busy: a statement waited longer than the lock "
            f"timeout (CELLSIGHT_DB_LOCK_TIMEOUT) for a lock another session holds ({why})",
        )
        self.url = safe_url(url)
        self.why = why


class DatabaseMissing(DatabaseUnavailable):
    """A SQLite database file that does not exist (moved, or a typo in its URL).

    Opening it would have created an empty database there and turned the mistake into
    an empty cell or "no such table" later; only the paths that create databases do
    (``cellsight.cells.database.create_database``). A kind of ``DatabaseUnavailable``, so
    every caller that copes with an unreachable database (the fan-out skipping a cell,
    the API's 503) copes with this one too.
    """

    reason = "database_missing"

    def __init__(self, url: str | sa.URL, path: object) -> None:
        CellsError.__init__(self, f"SQLite database file {str(path)!r} does not exist")
        self.url = safe_url(url)
        self.why = "no such file"
        self.path = str(path)


class UnknownCell(CellsError):
    reason = "unknown_cell"

    def __init__(self, ref: str, known: list[str] | None = None) -> None:
        # Names registered before they were checked may hold control characters: those
        # are shown escaped (repr), never raw on a terminal.
        names = ", ".join(n if n.isprintable() else repr(n) for n in known or ())
        hint = f" (known cells: {names})" if known else " (no cells registered)"
        # A mistyped reference may be anything a shell passes: its start names it.
        shown = repr(ref) if len(ref) <= 80 else f"{ref[:80] + '…'!r} ({len(ref)} characters)"
        super().__init__(f"unknown cell {shown}{hint}")
        self.ref = ref


class DuplicateCell(CellsError):
    reason = "duplicate_cell"

    def __init__(self, field: str, value: str, as_: str | None = None) -> None:
        # ``as_``: the registered spelling, where it differs only in case or spaces.
        shown = f" (as {as_!r})" if as_ is not None else ""
        super().__init__(f"a cell with {field} {value!r} is already registered{shown}")
        self.field = field
        self.value = value


class CellNotEmpty(CellsError):
    """``cells remove`` refused: the cell still holds what Nova's ``delete_cell`` refuses
    to drop (living instances always; compute nodes or mappings without ``--force``)."""

    reason = "cell_not_empty"

    def __init__(self, name: str, what: str) -> None:
        super().__init__(f"cell {name!r} is not empty: {what}")
        self.name = name


class CellEnabled(CellNotEmpty):
    """``cells remove`` of a cell that still takes new instances: disabled first."""

    def __init__(self, name: str) -> None:
        CellsError.__init__(
            self, f"cell {name!r} is enabled: `cellsight cells disable {name}` first"
        )
        self.name = name


class InstanceNotFound(CellsError):
    reason = "instance_not_found"

    def __init__(self, uuid: str, where: str = "") -> None:
        super().__init__(f"instance {uuid!r} not found{' in ' + where if where else ''}")
        self.uuid = uuid


class InstanceLocked(CellsError):
    reason = "instance_locked"

    def __init__(self, uuid: str, action: str, locked_reason: str | None) -> None:
        why = f" ({locked_reason})" if locked_reason else ""
        super().__init__(f"instance {uuid!r} is locked{why}; {action} needs an admin")
        self.uuid = uuid


class InvalidInstanceState(CellsError):
    reason = "invalid_instance_state"

    def __init__(self, uuid: str, action: str, state: str | None, allowed: set[str]) -> None:
        states = f" (allowed: {', '.join(sorted(allowed))})" if allowed else ""
        super().__init__(f"cannot {action} instance {uuid!r} in state {state!r}{states}")
        self.uuid = uuid
        self.state = state


class UnknownFlavor(CellsError):
    reason = "unknown_flavor"

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"unknown flavor {name!r} (known: {', '.join(known)})")
        self.name = name


class InvalidTag(CellsError):
    """A tag Nova's tag API refuses (and Tempest's server schema): over 60 characters,
    holding ',' or '/' (a listing's tags filter splits on ','), or over 50 of them."""

    reason = "invalid_tag"

    def __init__(self, why: str) -> None:
        super().__init__(f"invalid tags: {why}")


class NoValidHost(CellsError):
    reason = "no_valid_host"

    def __init__(self, why: str) -> None:
        super().__init__(f"no valid host: {why}")


class ConcurrentUpdate(CellsError):
    """Another writer changed the row between our read and our write; retry the action."""

    reason = "concurrent_update"

    def __init__(self, uuid: str) -> None:
        super().__init__(f"instance {uuid!r} changed concurrently; retry")
        self.uuid = uuid


class DuplicateInstance(CellsError):
    reason = "duplicate_instance"

    def __init__(self, uuid: str) -> None:
        super().__init__(f"instance {uuid!r} already exists")
        self.uuid = uuid


class UnreadableRow(CellsError):
    """A cell row that does not read as an instance (a value the payload model refuses,
    JSON that does not parse, a date that is not one): written by something other than
    Cellsight's operations. Named by its uuid; the cell's other rows are not at fault."""

    reason = "unreadable_row"

    def __init__(self, uuid: object, why: str) -> None:
        super().__init__(f"instance row {str(uuid)[:80]!r} does not read as an instance: {why}")
        self.uuid = uuid
        self.why = why

    @classmethod
    def of(cls, uuid: object, exc: BaseException) -> UnreadableRow:
        return cls(uuid, row_fault(exc))


def row_fault(exc: BaseException) -> str:
    """One line of what is wrong with a row: the model's first refusal by its field, with
    the value (its summary line names neither), else the error's own first line."""
    if isinstance(exc, ValidationError) and exc.error_count():
        err = exc.errors()[0]
        more = exc.error_count() - 1
        return (
            f"field {describe_location(err['loc'])}: {err['msg']} "
            f"(got {brief(err.get('input'), 60)})" + (f"; {more} more" if more else "")
        )
    if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None:
        exc = exc.orig  # the driver's words, without SQLAlchemy's statement
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


# What reading a row that something else wrote may raise: the model's refusal
# (pydantic's ValidationError is a ValueError), JSON or a date that does not parse, a
# value of the wrong type, JSON nested past the recursion limit.
ROW_FAULTS: tuple[type[Exception], ...] = (
    ValueError,
    TypeError,
    RecursionError,
    # A bound the contract keeps as stored too (a number past 64 bits: ``_bounds``),
    # raised as itself from the model: it made the fan-out's listing a 500.
    OutOfRange,
    MalformedNotification,
)


class TextTooLong(CellsError):
    """A name, an id or a metadata item longer than Nova's ``String(255)`` columns
    (the API's bodies bound them alike): refused before anything is written, where the
    notification's payload refused it after the checks, as a failure of the operation."""

    reason = "text_too_long"

    def __init__(self, field: str, value: str, limit: int) -> None:
        super().__init__(
            f"{field} {brief(value, 40)} is {len(value)} characters long; at most {limit}"
        )


class BlankText(CellsError):
    """An empty or blank name where one is required (a boot's, a rename's): Nova's
    schema wants at least one character."""

    reason = "blank_text"

    def __init__(self, field: str) -> None:
        super().__init__(f"{field} must not be empty or blank")
        self.field = field


class InvalidText(CellsError):
    """A name or id holding a character Nova's API refuses in names (its
    ``parameter_types.name`` pattern): a control, format, surrogate or unassigned code
    point, or a line or paragraph separator."""

    reason = "invalid_text"

    def __init__(self, field: str, value: str, char: str) -> None:
        super().__init__(
            f"{field} {value[:60]!r} holds U+{ord(char):04X}, which names may not hold "
            "(not a printable character: Nova's rule for names)"
        )
        self.field = field
