"""Which cell a cell database was registered as, written in the database itself.

The API database compares the URLs of registered cells, but two URLs can name one
database (``localhost`` and ``127.0.0.1``, the default port written out or not, another
user, other query options), and Nova's ``create_cell`` refuses a taken database because
two cells on one database list each of its instances twice. So ``cells add`` writes the
new cell's uuid into the database's ``cell_meta`` table, and a database whose mark names
a registered cell is that cell's when a token written through the new URL is read back
through the registered one. A copy of a cell's database (a restored backup) carries the
mark but not the token: it is another database and may be registered, its mark then
rewritten. A cell removed since does not hold its database. A database registered
before the table existed has no mark until it is added again.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable

import sqlalchemy as sa

from cellsight.cells.database import connect, write_transaction
from cellsight.cells.errors import BadDatabaseURL, DatabaseUnavailable
from cellsight.cells.schema import cell_mappings, cell_meta

MARK = "cell_uuid"
PROBE = "probe"


def registered_as(engine: sa.Engine) -> str | None:
    """The cell uuid the database was last registered as, or None (never, or before the
    mark existed)."""
    return _read(engine, MARK)


def mark(engine: sa.Engine, cell_uuid: str) -> None:
    """Record that the database is now registered as ``cell_uuid``."""
    _write(engine, MARK, cell_uuid)


def holder(
    engine: sa.Engine, api_engine: sa.Engine, engine_of: Callable[[str], sa.Engine]
) -> str | None:
    """The URL of the registered cell whose database ``engine`` reaches, or None."""
    owner = registered_as(engine)
    if owner is None:
        return None
    with connect(api_engine) as conn:
        url: str | None = conn.execute(
            sa.select(cell_mappings.c.database_connection).where(cell_mappings.c.uuid == owner)
        ).scalar_one_or_none()
    if url is None:
        return None  # that cell was removed
    try:
        return url if same_database(engine, engine_of(url)) else None
    except (DatabaseUnavailable, BadDatabaseURL):
        return None  # its database does not answer: the URL check stands alone


def same_database(engine: sa.Engine, other: sa.Engine) -> bool:
    """Whether a token written through ``engine`` is read through ``other``."""
    token = str(uuidlib.uuid4())
    if not _write(engine, PROBE, token):
        return False
    try:
        return _read(other, PROBE) == token
    finally:
        _write(engine, PROBE, None)


def _read(engine: sa.Engine, key: str) -> str | None:
    with connect(engine) as conn:
        if not sa.inspect(conn).has_table(cell_meta.name):
            return None
        value: str | None = conn.execute(
            sa.select(cell_meta.c.value).where(cell_meta.c.key == key)
        ).scalar_one_or_none()
    return value


def _write(engine: sa.Engine, key: str, value: str | None) -> bool:
    """Set (or with None, remove) ``key``; False when the table is not there (a schema
    the caller chose not to create)."""
    with write_transaction(engine) as conn:
        if not sa.inspect(conn).has_table(cell_meta.name):
            return False
        conn.execute(cell_meta.delete().where(cell_meta.c.key == key))
        if value is not None:
            conn.execute(cell_meta.insert().values(key=key, value=value))
    return True
