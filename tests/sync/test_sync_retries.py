"""A transient engine failure during a sync (a timeout, 429, 503, a busy embedded index)
is retried with a bounded backoff and the sync completes; a lasting one fails it after
the bounded attempts; a refusal, a conflict or a missing index fails it at once.

The HTTP engine is a real osmem behind ``tests.support.bulk_faults``, a proxy that
spoils chosen bulk requests (a timeout after the engine applied the request, or an
error status instead of forwarding it). The embedded engine meets a real busy
database: another connection holding SQLite's write lock.
"""

from __future__ import annotations

import logging
import sqlite3
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from cellsight.cells.database import Engines
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellRegistry
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.engines.opensearch import OpenSearchEngine
from cellsight.indexer.index_roles import layout
from cellsight.indexer.retries import RETRY_ROUNDS
from cellsight.indexer.sync import SyncFailed, SyncOptions, run_sync
from cellsight.indexer.verify import Verifier
from tests.support.bulk_faults import TIMEOUT, BulkFaults
from tests.support.services import DatabaseFactory, osmem_clone_url
from tests.support.sync_progress import AfterBatches
from tests.support.sync_world import IndexingPublisher, World

BULK_TIMEOUT = 2.0  # what a TIMEOUT fault costs; a real bulk here takes milliseconds
BACKOFF = 0.001  # the retries' backoff, so no test waits on it
ROWS = 60  # two cells of 30


def fast(**options: Any) -> SyncOptions:
    return SyncOptions(batch_size=5, retry_backoff=BACKOFF, **options)


@pytest.fixture
def proxied(
    request: pytest.FixtureRequest, make_database: DatabaseFactory, tmp_path: Path
) -> Iterator[tuple[World, BulkFaults]]:
    """Two seeded SQLite cells, and osmem reached through a ``BulkFaults`` proxy."""
    yield from _proxied(request, make_database, tmp_path, "/_bulk")


# A read spoiled, and the first of them: a scan's point in time (the first ``_search``
# request), its first page (the second), a document read.
READS = [("/_search", 1), ("/_search", 2), ("/_mget", 1)]


@pytest.fixture(params=READS, ids=["point-in-time", "page", "mget"])
def proxied_reads(
    request: pytest.FixtureRequest, make_database: DatabaseFactory, tmp_path: Path
) -> Iterator[tuple[World, BulkFaults, int]]:
    """As ``proxied``, spoiling a scan's requests or document reads from ``first``."""
    endpoint, first = request.param
    for world, proxy in _proxied(request, make_database, tmp_path, endpoint):
        yield world, proxy, first


def _proxied(
    request: pytest.FixtureRequest, make_database: DatabaseFactory, tmp_path: Path, endpoint: str
) -> Iterator[tuple[World, BulkFaults]]:
    proxy = BulkFaults(osmem_clone_url(request), endpoint)
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}", Engines(connect_timeout=5))
    registry.create_schema()
    engine = OpenSearchEngine(
        proxy.url, prefix=f"t{uuid.uuid4().hex[:10]}", timeout=10.0, bulk_timeout=BULK_TIMEOUT
    )
    world = World(
        registry,
        engine,
        "sqlite",
        make_url=lambda: make_database("sqlite"),
        cells_dir=tmp_path / "cells",
    )
    world.add_cells(2, ROWS // 2)
    yield world, proxy
    engine.close()
    registry.close()
    proxy.close()


def _documents_in(body: bytes) -> int:
    return len([line for line in body.splitlines() if line.strip()]) // 2


def _stale(cells: Sequence[dict[str, Any]]) -> int:
    return sum(int(c["stale"]) for c in cells)


@pytest.mark.services
@pytest.mark.parametrize("fault", [TIMEOUT, 429, 503])
def test_a_transient_failure_of_a_bulk_write_is_retried(
    proxied: tuple[World, BulkFaults], fault: int | str
) -> None:
    world, proxy = proxied
    proxy.arm(fault, first=3)  # some batches are written before it
    report = run_sync(world.engine, world.registry, fast())
    (spoiled,) = proxy.spoiled
    assert proxy.sent(spoiled) == 2  # the same batch once more, and only once
    assert report.rows == ROWS and report.documents == ROWS
    world.assert_index_equals_cells()
    if fault == TIMEOUT:
        # The engine applied the request whose answer was lost: the retry found its
        # documents written already (versioned writes), and the sync counted them stale.
        assert _stale(report.cells) >= _documents_in(spoiled)


@pytest.mark.services
def test_a_transient_failure_of_a_cell_sync_write_is_retried(
    proxied: tuple[World, BulkFaults],
) -> None:
    """``--cell`` writes through the write alias (``bulk``, not ``bulk_index``)."""
    world, proxy = proxied
    run_sync(world.engine, world.registry, fast())
    one = world.cells[0]
    world.bump(one, list(world.revisions(one)), display_name="changed")
    proxy.arm(503, first=2)
    report = run_sync(world.engine, world.registry, fast(cells=[one.name]))
    (spoiled,) = proxy.spoiled
    assert proxy.sent(spoiled) == 2
    assert report.cells[0]["written"] == ROWS // 2
    world.assert_index_equals_cells()


@pytest.mark.services
@pytest.mark.parametrize("fault", [400, 404, 409])
def test_a_non_transient_failure_fails_the_sync_without_a_retry(
    proxied: tuple[World, BulkFaults], fault: int
) -> None:
    """A refusal (400), a missing index (404), a conflict (409): sending again would only
    be refused again."""
    world, proxy = proxied
    run_sync(world.engine, world.registry, fast())
    serving = layout(world.engine, "instance").serving
    assert serving is not None
    proxy.arm(fault, first=3)
    with pytest.raises(SyncFailed) as failed:
        run_sync(world.engine, world.registry, fast())
    (spoiled,) = proxy.spoiled
    assert proxy.sent(spoiled) == 1
    message = str(failed.value)
    assert f"injected {fault}" in message and "\n" not in message
    assert f"{serving.name} still serves" in message
    world.assert_index_equals_cells()


@pytest.mark.services
def test_a_lasting_outage_fails_the_sync_after_the_bounded_retries(
    proxied: tuple[World, BulkFaults],
) -> None:
    world, proxy = proxied
    run_sync(world.engine, world.registry, fast())
    serving = layout(world.engine, "instance").serving
    assert serving is not None
    proxy.arm(503, first=3, times=None)  # every bulk request from the third on
    with pytest.raises(SyncFailed) as failed:
        run_sync(world.engine, world.registry, fast())
    assert max(proxy.sent(body) for body in proxy.spoiled) == RETRY_ROUNDS + 1
    message = str(failed.value)
    assert "EngineUnavailable" in message and "injected 503" in message
    assert "\n" not in message and f"{serving.name} still serves" in message
    world.assert_index_equals_cells()


@pytest.mark.services
@pytest.mark.parametrize("fault", [TIMEOUT, 503])
def test_a_transient_failure_of_a_repair_is_retried(
    proxied: tuple[World, BulkFaults], fault: int | str
) -> None:
    """``index verify --repair`` (and a sync's catch-up, which repairs the same way)."""
    world, proxy = proxied
    run_sync(world.engine, world.registry, fast())
    one = world.cells[0]
    behind = list(world.revisions(one))[:4]
    world.bump(one, behind, display_name="changed behind the index's back")
    proxy.arm(fault, first=1)
    verifier = Verifier(world.engine, world.registry, "instance", repair=True, backoff=BACKOFF)
    report = verifier.run(world.registry.list_cells(), whole=True)
    (spoiled,) = proxy.spoiled
    assert proxy.sent(spoiled) == 2
    first = report.cells[0]
    assert first.stale == 4 and first.errors == [] and first.repair_failed == 0
    # A timed-out request the engine applied reads as a repair a newer write won.
    assert first.repaired + first.repair_lost_to_newer == 4
    world.assert_index_equals_cells()


@pytest.mark.services
def test_a_busy_engine_s_reads_are_retried_by_verify(
    proxied_reads: tuple[World, BulkFaults, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe: beside a busy indexer, ``index verify`` left cells "not compared:
    EngineTimeout" where one page of a scan, or one document read, timed out."""
    from cellsight.indexer import retries

    world, proxy, first = proxied_reads
    run_sync(world.engine, world.registry, fast())
    # Missing: four instances whose notifications were lost before the bus (a missing
    # document is looked for under the other cells first: ``_mget``).
    publisher = IndexingPublisher(world.engine)
    publisher.drop = True
    boot = BootRequest(display_name="lost", flavor="m1.tiny", project_id="p", user_id="u",
                       cell=world.cells[0].name, count=4)  # fmt: skip
    world.ops(publisher).boot(boot)
    monkeypatch.setattr(retries, "MAX_BACKOFF", 0.02)  # a scan's retries wait that long
    proxy.arm(503, first=first, times=2)
    verifier = Verifier(world.engine, world.registry, "instance", repair=True, backoff=BACKOFF)
    report = verifier.run(world.registry.list_cells(), whole=True)
    assert len(proxy.spoiled) == 2  # both faults met, and ridden out
    assert [(c.failed, c.errors) for c in report.cells] == [(None, [])] * 2
    assert report.cells[0].missing == 4 and report.cells[0].repaired == 4
    world.assert_index_equals_cells()


@pytest.fixture
def proxied_aliases(
    request: pytest.FixtureRequest, make_database: DatabaseFactory, tmp_path: Path
) -> Iterator[tuple[World, BulkFaults]]:
    """As ``proxied``, spoiling the alias reads every first step makes."""
    yield from _proxied(request, make_database, tmp_path, "/_alias")


@pytest.mark.services
@pytest.mark.parametrize("command", ["sync", "sync --cell", "verify"])
def test_a_busy_engine_at_the_first_steps_is_ridden_out(
    proxied_aliases: tuple[World, BulkFaults], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """A probe (osmem frozen as a verify began): the first steps, the indexes made ready
    and what an unfinished sync left cleaned up, were not retried as the rest is."""
    from cellsight.indexer import retries
    from cellsight.indexer.antientropy import verify_resource

    world, proxy = proxied_aliases
    run_sync(world.engine, world.registry, fast())
    monkeypatch.setattr(retries, "MAX_BACKOFF", 0.02)
    proxy.arm(503, first=1, times=2)
    if command == "verify":
        report = verify_resource(world.engine, world.registry, "instance", repair=True)
        assert [c.failed for c in report.cells] == [None, None]
    else:
        cells = [world.cells[0].name] if command == "sync --cell" else []
        run_sync(world.engine, world.registry, fast(cells=cells))
    assert len(proxy.spoiled) == 2  # both faults met, and ridden out
    world.assert_index_equals_cells()


class _Holder(logging.Handler):
    """Takes SQLite's write lock on the index file from another connection when asked,
    and gives it back at the first retry the sync logs: a real busy database, once."""

    def __init__(self, path: Path) -> None:
        super().__init__(logging.WARNING)
        # given back from the sync's worker thread, where the retry is logged
        self.conn = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")  # as the engine has it already
        self.retries: list[str] = []
        self.holding = False

    def hold(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self.holding = True

    def emit(self, record: logging.LogRecord) -> None:
        self.retries.append(record.getMessage())
        if self.holding:
            self.conn.execute("ROLLBACK")
            self.holding = False


def test_a_busy_embedded_index_is_retried(make_world: Any, tmp_path: Path) -> None:
    """The embedded engine's busy database is ``EngineUnavailable`` too, and rightly
    retried: another writer (the live indexer) held SQLite's lock past the engine's
    ``timeout``, and lets it go."""
    world: World = make_world("sqlite", "embedded")
    path = tmp_path / "index.db"
    # The same index, waiting 0.2 s for a busy database rather than 5 s.
    engine = EmbeddedEngine(path, prefix=world.engine.prefix, timeout=0.2)
    run_sync(engine, world.registry, fast())
    holder = _Holder(path)
    retry_log = logging.getLogger("cellsight.indexer.retries")
    retry_log.addHandler(holder)
    try:
        report = run_sync(engine, world.registry, fast(), progress=AfterBatches(2, holder.hold))
    finally:
        retry_log.removeHandler(holder)
        holder.conn.close()
        engine.close()
    assert holder.retries and "busy" in holder.retries[0], holder.retries
    assert report.rows == ROWS
    world.assert_index_equals_cells()
