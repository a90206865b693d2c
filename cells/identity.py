"""Which cell a cell database was registered as, written in the database itself.

The API database compares the URLs of registered cells, but two URLs can name one
database (``localhost`` and ``127.0.0.1``, the default port written out or not, another
user, other query options), and Nova's ``create_cell`` refuses a taken database because
two cells on one database list each of its instances twice. So ``cells add`` writes the
new cell's uuid into the database's ``cell_meta`` table and refuses a database whose
mark names a cell still registered. A cell removed since (its database is left as it
is) does not hold its database: it can be registered again, and the mark is rewritten.
A database registered before the table existed has no mark until it is added again.
"""

from __future__ import annotations

import sqlalchemy as sa

from cellsight.cells.database import connect, write_transaction
from cellsight.cells.schema import cell_meta

MARK = "cell_uuid"


def registered_as(engine: sa.Engine) -> str | None:
    """The cell uuid the database was last registered as, or None (never, or before the
    mark existed)."""
    with connect(engine) as conn:
        if not sa.inspect(conn).has_table(cell_meta.name):
            return None
        value: str | None = conn.execute(
            sa.select(cell_meta.c.value).where(cell_meta.c.key == MARK)
        ).scalar_one_or_none()
    return value


def mark(engine: sa.Engine, cell_uuid: str) -> None:
    """Record that the database is now registered as ``cell_uuid``."""
    with write_transaction(engine) as conn:
        if not sa.inspect(conn).has_table(cell_meta.name):
            return  # a schema the caller chose not to create: the URL check stands alone
        conn.execute(cell_meta.delete().where(cell_meta.c.key == MARK))
        conn.execute(cell_meta.insert().values(key=MARK, value=cell_uuid))
