"""Fast seeding of new cells with a realistic, deterministic spread of instances.

Speed comes from: rows generated column-wise per chunk (one ``random.choices(k=n)``
per column rather than a call per row per field), JSON columns written from
pre-serialised templates, rows handed to the driver's ``executemany`` as tuples
(``bulk.py``) without per-value type processing, a new cell's indexes built after its
rows are in, and cells loaded in parallel worker processes (the work is CPU-bound
Python; threads would share one GIL).

Ordering: loaded serially (one cell, or with ``--notify``), each chunk's instance
mappings are written before its rows, as boot does. Loaded in parallel
(``seed_workers``), a worker returns its cell's mappings and the parent writes them
after the rows. Either way a cell is registered before its load (its mappings refer to
it), so a seed that fails or is interrupted undoes what it made (``seed_undo``): a
rerun starts clean and the demo does not take a partial seed for its data.
"""

from __future__ import annotations

import os
import random
import time
import uuid as uuidlib
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from cellsight.cells import bulk, outbox
from cellsight.cells.database import create_database, parse_url
from cellsight.cells.dialects import Timeouts
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.rows import create_payload
from cellsight.cells.schema import (
    compute_nodes,
    create_cell_indexes,
    create_cell_schema,
    instance_mappings,
    instances,
)
from cellsight.cells.seed_undo import Made, SeedInterrupted
from cellsight.cells.seeddata import Generator, HostUsage
from cellsight.notifications.envelope import Notification
from cellsight.notifications.publisher import Publisher

Progress = Callable[[int], None]
Tuples = list[tuple[Any, ...]]

RELAY_BATCH = 1000  # notifications a publish with confirms, as the seed delivers its outbox
# Below this many instances per cell, starting worker processes costs more than it saves.
PARALLEL_MIN_INSTANCES = 20_000


@dataclass
class SeedReport:
    cells: list[CellMapping] = field(default_factory=list)
    instances: int = 0
    compute_nodes: int = 0
    mappings: int = 0
    notifications: int = 0  # published
    waiting: int = 0  # left in the cells' outboxes for a relay (the bus failed, or one ran)
    seconds: float = 0.0

    @property
    def rows_per_s(self) -> float:
        """Instance rows per second of wall time (mappings and nodes included in the time)."""
        return self.instances / self.seconds if self.seconds > 0 else 0.0


def _cell_names(
    registry: CellRegistry, prefix: str, count: int, files_in: Path | None = None
) -> list[str]:
    """The next free names; with ``files_in``, also free of a ``NAME.db`` there: one no
    cell uses (left by a seed that was killed) is not this run's to fill or remove."""
    taken = {cell.name for cell in registry.list_cells()}
    if files_in is not None and files_in.is_dir():
        taken |= {path.stem for path in files_in.glob("*.db")}
    names: list[str] = []
    index = 1
    while len(names) < count:
        name = f"{prefix}{index}"
        if name not in taken:
            names.append(name)
        index += 1
    return names


def seed(
    registry: CellRegistry,
    *,
    cells: int,
    instances_per_cell: int,
    cells_dir: Path,
    db_urls: Sequence[str] = (),
    seed: int = 0,
    name_prefix: str = "cell",
    chunk_size: int = 10_000,
    progress: Progress | None = None,
    publisher: Publisher | None = None,
    publisher_id: str = "cellsight-seed",
    now: datetime | None = None,
    workers: int | None = None,
) -> SeedReport:
    """Create ``cells`` new cells holding ``instances_per_cell`` instances each.

    Cells are SQLite files in ``cells_dir`` unless ``db_urls`` gives one URL per cell.
    The same ``seed``, ``now`` and starting registry give the same data (serial or
    parallel); a second run continues the cell numbering and so makes new uuids. With a
    ``publisher``, each chunk's ``instance.create.end`` notifications go into the cell's
    outbox in the chunk's transaction and are delivered from it after the commit.
    ``workers`` processes load cells in parallel (default: one per CPU, when there are
    several big cells and no publisher).
    """
    if cells < 1:
        raise ValueError("cells must be at least 1")
    if instances_per_cell < 0:
        raise ValueError("instances must not be negative")
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    if db_urls and len(db_urls) != cells:
        raise ValueError(f"{len(db_urls)} database URLs given for {cells} cells; give one per cell")
    for url in db_urls or ():
        parse_url(url)  # every URL checked before anything is made
    made = Made()
    try:
        return _seed(
            registry, made, cells, instances_per_cell, db_urls, cells_dir, seed, name_prefix,
            chunk_size, progress, publisher, publisher_id, now, workers,
        )  # fmt: skip
    except KeyboardInterrupt as exc:
        # Said in the one line: a bare "interrupted" left the operator to guess whether
        # the cells it had made were still registered (a README probe).
        raise SeedInterrupted(f"seed interrupted: {made.undo(registry)}") from exc
    except BaseException:
        # Failed: what this run made is undone, so a rerun starts clean.
        made.undo(registry)
        raise


def _seed(
    registry: CellRegistry,
    made: Made,
    cells: int,
    instances_per_cell: int,
    db_urls: Sequence[str] | None,
    cells_dir: Path,
    seed: int,
    name_prefix: str,
    chunk_size: int,
    progress: Progress | None,
    publisher: Publisher | None,
    publisher_id: str,
    now: datetime | None,
    workers: int | None,
) -> SeedReport:
    now = now or datetime.now(UTC)
    report = SeedReport()
    started = time.perf_counter()
    ordinal = len(registry.list_cells())
    jobs: list[CellJob] = []
    names = _cell_names(registry, name_prefix, cells, None if db_urls else cells_dir)
    for index, name in enumerate(names):
        url = db_urls[index] if db_urls else f"sqlite:///{(cells_dir / f'{name}.db').resolve()}"
        made.database(registry, url)
        create_database(url, connect_timeout=registry.engines.timeouts.connect)
        # A fresh cell database gets its indexes after the load: far faster to build.
        create_cell_schema(registry.engines.get(url), indexes=False)
        job = CellJob(
            url,
            "",
            name,
            ordinal + index,
            seed,
            now,
            instances_per_cell,
            chunk_size,
            registry.api_engine.dialect.name,
            registry.engines.timeouts,
        )
        cell_uuid, _ = job.generator()
        cell = registry.add_cell(name, url, uuid=cell_uuid, create_schema=False)
        made.cells.append(cell)
        report.cells.append(cell)
        jobs.append(CellJob(**{**job.__dict__, "cell_uuid": cell_uuid}))
    if workers is None:
        big = instances_per_cell >= PARALLEL_MIN_INSTANCES and publisher is None
        workers = min(len(jobs), os.cpu_count() or 1) if big else 1
    if workers > 1 and publisher is None:
        from cellsight.cells.seed_workers import load_parallel  # it imports this module

        load_parallel(registry, jobs, workers, report, progress)
    else:
        for job in jobs:
            load_cell(
                job,
                registry.engines.get(job.url),
                registry.api_engine,
                report,
                progress,
                publisher,
                publisher_id,
            )
    report.seconds = time.perf_counter() - started
    return report


@dataclass(frozen=True)
class CellJob:
    """What loading one cell needs; plain values, so it can go to a worker process."""

    url: str
    cell_uuid: str
    name: str
    ordinal: int
    seed: int
    now: datetime
    instances: int
    chunk_size: int
    api_dialect: str
    timeouts: Timeouts  # the registry's, for a worker process's engine

    def generator(self) -> tuple[str, Generator]:
        """The cell's uuid and row generator, both from the cell's own random stream."""
        rng = random.Random(f"cellsight-seed:{self.seed}:{self.ordinal}")
        cell_uuid = str(uuidlib.UUID(int=rng.getrandbits(128), version=4))
        gen = Generator(
            rng,
            seed=self.seed,
            cell_index=self.ordinal,
            cell_name=self.name,
            now=self.now,
            instances=self.instances,
        )
        return cell_uuid, gen


def load_cell(
    job: CellJob,
    engine: sa.Engine,
    api_engine: sa.Engine | None,
    report: SeedReport,
    progress: Progress | None = None,
    publisher: Publisher | None = None,
    publisher_id: str = "cellsight-seed",
) -> Tuples:
    """Load one cell. Without ``api_engine`` the mappings are returned, not written."""
    _, gen = job.generator()
    usage: dict[str, HostUsage] = {}
    kept: Tuples = []
    dates_as_text = engine.dialect.name == "sqlite"
    relay = None if publisher is None else outbox.Outbox(publisher, batch=RELAY_BATCH)
    notify = None if relay is None else partial(_announce, job.cell_uuid, publisher_id)
    failed = False
    with ExitStack() as stack:
        api = stack.enter_context(bulk.loading(api_engine)) if api_engine is not None else None
        conn = stack.enter_context(bulk.loading(engine))
        done = 0
        while done < job.instances:
            n = min(job.chunk_size, job.instances - done)
            rows = gen.instances(n, usage, dates_as_text=dates_as_text)
            mappings = gen.mappings(rows, job.cell_uuid, job.api_dialect)
            if api is None:
                kept.extend(mappings)
            else:
                with api.begin():
                    bulk.insert(api, instance_mappings, bulk.MAPPING_COLUMNS, mappings)
                report.mappings += len(mappings)
            _insert_rows(conn, gen.columns, rows, notify)
            report.instances += n
            if relay is not None and not failed:
                # A bus that failed once is not tried again per chunk: what it did not
                # take waits in the outbox, as everything after it does.
                delivered = relay.deliver(engine)
                report.notifications += delivered.published
                failed = delivered.error is not None
            done += n
            if progress is not None:
                progress(n)
        nodes = gen.compute_nodes(usage)
        with conn.begin():
            if nodes:
                conn.execute(compute_nodes.insert(), nodes)
        report.compute_nodes += len(nodes)
        create_cell_indexes(conn)
        if relay is not None:
            with conn.begin():
                report.waiting += outbox.pending(conn)
    return kept


def _insert_rows(
    conn: sa.Connection,
    columns: Sequence[str],
    rows: Tuples,
    notify: Callable[[list[dict[str, Any]]], list[Notification]] | None,
) -> None:
    """Insert a chunk; with ``notify``, read it back and put its notifications into the
    cell's outbox in the same transaction, as every operation does (none is lost to a
    bus that fails between the commit and the publish)."""
    with conn.begin():
        last_id = conn.execute(sa.select(sa.func.max(instances.c.id))).scalar() or 0
        bulk.insert(conn, instances, columns, rows)
        if notify is not None:
            query = sa.select(instances).where(instances.c.id > last_id)
            outbox.add_many(conn, notify([dict(r) for r in conn.execute(query).mappings()]))


def _announce(cell_uuid: str, publisher_id: str, rows: list[dict[str, Any]]) -> list[Notification]:
    end = "instance.create.end"
    return [Notification.create(end, publisher_id, create_payload(r, cell_uuid)) for r in rows]
