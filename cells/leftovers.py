"""Instance mappings left by builds that died.

A boot or a reservation maps its instances (API database) before its cell transaction
inserts their rows (``boots.mapped``), and removes the mappings again if that fails. A
process killed in between leaves a mapping without a row, which nothing else removes.
Readers treat it as "not found"; what must not happen is that it holds its uuid for
ever. A mapping is taken for such a leftover once it is older than any build could be
(``dead_build_age``) and its cell answers that it holds no row for it: a new boot or
reservation of that uuid then removes it and takes the uuid (``place_reclaiming``), and
``cells remove --force`` removes it with its cell (``cell_removal``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from cellsight.cells.database import connect, write_transaction
from cellsight.cells.errors import CellsError
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.reads import deleted_flags
from cellsight.cells.schema import instance_mappings

log = logging.getLogger(__name__)

# A build holds a mapping without a row for its cell transaction: seconds, each statement
# at most the statement timeout. Older than this (or than three statement timeouts, for
# an operator who raised it: a heuristic, since a transaction runs several statements and
# a conflict is retried), the build that made it has died.
DEAD_BUILD = timedelta(minutes=15)


def dead_build_age(registry: CellRegistry) -> timedelta:
    """From the builds' statement bound (``db_statement_timeout``) where the registry
    knows it, else its own engines' (a process that reclaims, as the API, may bound its
    own statements tighter than the CLI bounds a boot's)."""
    statement = registry.build_timeout or registry.engines.timeouts.statement
    if not statement:
        return DEAD_BUILD
    return max(DEAD_BUILD, timedelta(seconds=3 * statement))


def dead_before(registry: CellRegistry) -> datetime:
    """Mappings made before then without a row were left by builds that died."""
    return datetime.now(UTC) - dead_build_age(registry)


def place_reclaiming(
    registry: CellRegistry, cell_uuid: str, mappings: Sequence[tuple[str, str, str | None]]
) -> None:
    """``registry.place_instances``; a uuid held only by a dead build's leftover mapping
    is taken back for it. A uuid in use raises ``IntegrityError`` as before."""
    try:
        registry.place_instances(cell_uuid, mappings)
    except sa.exc.IntegrityError:
        if not reclaim(registry, [uuid for uuid, _, _ in mappings]):
            raise
        registry.place_instances(cell_uuid, mappings)


def reclaim(registry: CellRegistry, uuids: Sequence[str]) -> list[str]:
    """Removes the leftover mappings among those of ``uuids`` and returns their uuids.
    A mapping whose cell cannot be read now is kept: whether it has a row is unknown."""
    before = dead_before(registry)
    m = instance_mappings.c
    old = sa.select(m.instance_uuid, m.cell_uuid).where(
        m.instance_uuid.in_(list(uuids)), m.created_at < before, m.cell_uuid.is_not(None)
    )
    with connect(registry.api_engine) as conn:
        by_cell: dict[str, set[str]] = defaultdict(set)
        for uuid, cell_uuid in conn.execute(old):
            by_cell[str(cell_uuid)].add(str(uuid))
    leftovers: list[tuple[str, str]] = []
    for cell_uuid, mapped in by_cell.items():
        try:
            with connect(registry.cell_engine(cell_uuid)) as conn:
                rows = deleted_flags(conn, sorted(mapped)).keys()
        except (CellsError, sa.exc.SQLAlchemyError) as exc:  # unknown, unreachable, broken
            # Undecided: the uuid stays taken, as before (never this boot's error).
            log.warning("leftover mappings in cell %s not reclaimed: %s", cell_uuid, exc)
            continue
        leftovers.extend((uuid, cell_uuid) for uuid in sorted(mapped - rows))
    if not leftovers:
        return []
    with write_transaction(registry.api_engine) as conn:
        for uuid, cell_uuid in leftovers:
            # Still the old one: a reclaimer racing this one may have placed it anew.
            conn.execute(
                instance_mappings.delete().where(
                    m.instance_uuid == uuid, m.cell_uuid == cell_uuid, m.created_at < before
                )
            )
    reclaimed = [uuid for uuid, _ in leftovers]
    log.warning("reclaimed mappings left by builds that died: %s", ", ".join(reclaimed))
    return reclaimed
