"""What a new cell may not share with a registered one, checked under a lock.

The unique index on ``cell_mappings.name`` is exact, but names are told apart as people
read them (``same_name``), a rule no index of the three dialects states alike (SQLite's
``lower()`` folds ASCII only). So the check runs in Python, and registrations are
serialized so that two racing with "C1" and "c1" cannot both pass it: by the write
lock ``BEGIN IMMEDIATE`` takes on SQLite, and elsewhere by a row lock on one record of
``api_meta``, which holds whatever the isolation level (the engines run READ
COMMITTED, under which a locking read of the table would not stop an insert).
"""

from __future__ import annotations

import sqlalchemy as sa

from cellsight.cells.database import connect
from cellsight.cells.errors import DuplicateCell, safe_url
from cellsight.cells.schema import api_meta, cell_mappings, utcnow

REGISTRATION_LOCK = "lock:cell_registration"


def prepare_registration_lock(engine: sa.Engine) -> None:
    """Make the lock's record if it is missing (before the transaction that takes it:
    two first registrations inserting it in theirs would fail one on the key)."""
    if engine.dialect.name == "sqlite":
        return
    key = api_meta.c.key
    with connect(engine) as conn:
        try:
            with conn.begin():
                if conn.execute(sa.select(key).where(key == REGISTRATION_LOCK)).first() is None:
                    conn.execute(
                        api_meta.insert().values(
                            key=REGISTRATION_LOCK, value="{}", updated_at=utcnow()
                        )
                    )
        except sa.exc.IntegrityError:
            pass  # another registration made it first: the lock is there


def hold_registration_lock(conn: sa.Connection) -> None:
    """Inside the registering transaction: until it ends, another waits here."""
    if conn.dialect.name == "sqlite":
        return  # BEGIN IMMEDIATE (``write_transaction``) serialized the writers already
    key = api_meta.c.key
    conn.execute(sa.select(key).where(key == REGISTRATION_LOCK).with_for_update()).first()


def refuse_taken(
    conn: sa.Connection, name: str, cell_uuid: str, url: str, taken_by: str | None = None
) -> None:
    # The database too, as Nova's ``create_cell`` refuses a taken database connection:
    # two cells on one database list each of its instances twice. By its URL, and by the
    # registered cell another URL of it belongs to (``cells.identity.holder``).
    if taken_by is not None:
        raise DuplicateCell("database", safe_url(taken_by))
    cells = conn.execute(
        sa.select(cell_mappings.c.name, cell_mappings.c.uuid, cell_mappings.c.database_connection)
    ).all()
    for other, _, _ in cells:
        if same_name(other, name):
            raise DuplicateCell("name", name, as_=other if other != name else None)
    # A cell is named by its name or its uuid (``get_cell``, which reads a uuid in any
    # case): a name that is another cell's uuid, or a uuid that is another's name, would
    # make one of them unreachable.
    for taken, field, shown in (
        (any(name.lower() == u for _, u, _ in cells), "uuid", name),
        (any(cell_uuid == u for _, u, _ in cells), "uuid", cell_uuid),
        (any(cell_uuid == n.lower() for n, _, _ in cells), "name", cell_uuid),
        (any(url == d for _, _, d in cells), "database", safe_url(url)),
    ):
        if taken:
            raise DuplicateCell(field, shown)


def same_name(a: str, b: str) -> bool:
    """Names are told apart as people read them, not by case or the spaces around them:
    " c1" beside "c1" cannot be told apart in a listing, and where Nova's API database
    has MySQL's default collation, "C1" is "c1"."""
    return a.strip().casefold() == b.strip().casefold()
