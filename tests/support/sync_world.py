"""The world of the bulk sync and anti-entropy tests: a registry with seeded cells on one
dialect, an engine (embedded, or a clone of the session's osmem server: keep its data to
tens of instances), and ``IndexingPublisher``, the live write path: the notifications of
``cellsight.cells.operations.Operations`` go through
``cellsight.indexer.writer.BatchWriter`` into the engine, exactly as the indexer writes them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from cellsight.cells.database import connect
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.operations import Operations
from cellsight.cells.schema import compute_nodes, instances
from cellsight.cells.seed import seed
from cellsight.indexer.documents import comparable
from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.row_documents import node_row_document, reference_document
from cellsight.indexer.writer import BatchWriter, Verdict
from cellsight.notifications.envelope import Notification
from cellsight.settings import Settings, load_settings
from tests.support.services import osmem_clone_url


def make_engine(request: pytest.FixtureRequest, kind: str, path: Path) -> SearchEngine:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    if kind == "embedded":
        return EmbeddedEngine(path, prefix=prefix)
    from cellsight.indexer.engines.opensearch import OpenSearchEngine

    return OpenSearchEngine(osmem_clone_url(request), prefix=prefix, timeout=10.0)


class IndexingPublisher:
    """A real ``Publisher``: each notification through the indexer's ``BatchWriter``.
    ``drop`` loses them instead (a producer that crashed between commit and publish)."""

    def __init__(self, engine: SearchEngine) -> None:
        self.writer = BatchWriter(engine, max_backoff=1.0)
        self.drop = False

    def publish(self, notification: Notification) -> None:
        self.publish_many([notification])

    def publish_many(self, notifications: Sequence[Notification]) -> None:
        if self.drop:
            return
        bodies = [json.dumps(n.to_oslo()).encode() for n in notifications]
        for outcome in self.writer.write(bodies):
            assert outcome.verdict in (Verdict.INDEXED, Verdict.STALE), outcome


@dataclass
class World:
    registry: CellRegistry
    engine: SearchEngine
    dialect: str
    cells: list[CellMapping] = field(default_factory=list)
    make_url: Callable[[], str] | None = None
    cells_dir: Path | None = None

    def add_cells(self, count: int, instances: int) -> list[CellMapping]:
        """New seeded cells on this world's dialect."""
        assert self.make_url is not None and self.cells_dir is not None
        urls = [self.make_url() for _ in range(count)]
        added = seed(
            self.registry,
            cells=count,
            instances_per_cell=instances,
            cells_dir=self.cells_dir,
            db_urls=urls,
        ).cells
        self.cells.extend(added)
        return added

    def ops(self, publisher: IndexingPublisher | None = None) -> Operations:
        return Operations(self.registry, publisher or IndexingPublisher(self.engine))

    def cell(self, name: str) -> CellMapping:
        return next(c for c in self.cells if c.name == name)

    def rows(self, resource: str = "instance") -> dict[str, dict[str, Any]]:
        """uuid → the document each cell row maps to (the reference path)."""
        table = instances if resource == "instance" else compute_nodes
        out = {}
        for cell in self.registry.list_cells():
            with connect(self.registry.cell_engine(cell)) as conn:
                query = sa.select(table)
                if resource == "node":
                    query = query.where(compute_nodes.c.deleted.is_(False))
                for row in conn.execute(query).mappings():
                    if resource == "instance":
                        doc = reference_document(dict(row), cell.uuid, "instance.sync")
                    else:
                        doc = node_row_document(dict(row), cell.uuid)
                    out[doc["uuid"]] = comparable(doc)
        return out

    def documents(self, resource: str = "instance") -> dict[str, dict[str, Any]]:
        """uuid → the stored document behind the read alias."""
        self.engine.refresh(resource)
        out = {}
        for doc_id, _ in self.engine.iter_versions(resource):
            stored = self.engine.get(resource, doc_id)
            assert stored is not None
            out[doc_id] = comparable(stored.document)
        return out

    def assert_index_equals_cells(self, resource: str = "instance") -> None:
        expected, stored = self.rows(resource), self.documents(resource)
        assert sorted(stored) == sorted(expected)
        different = [u for u in expected if expected[u] != stored[u]]
        assert not different, {u: _diff(expected[u], stored[u]) for u in different[:3]}

    def revisions(self, cell: CellMapping) -> dict[str, int]:
        with connect(self.registry.cell_engine(cell)) as conn:
            return dict(conn.execute(sa.select(instances.c.uuid, instances.c.revision)).all())

    def bump(self, cell: CellMapping, uuids: Sequence[str], **values: Any) -> None:
        """Change rows behind the notifications' back (a lost notification)."""
        with connect(self.registry.cell_engine(cell)) as conn, conn.begin():
            conn.execute(
                instances.update()
                .where(instances.c.uuid.in_(list(uuids)))
                .values(revision=instances.c.revision + 1, **values)
            )


def _diff(expected: dict[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
    keys = set(expected) | set(stored)
    return {k: (expected.get(k), stored.get(k)) for k in keys if expected.get(k) != stored.get(k)}


def seeded_settings(data_dir: Path, *, cells: int = 2, instances_per_cell: int = 10) -> Settings:
    """Embedded defaults in ``data_dir`` with ``cells`` seeded SQLite cells: the world of
    the CLI's sync, verify and purge tests."""
    settings = load_settings(data_dir=data_dir)
    registry = CellRegistry.from_settings(settings)
    seed(registry, cells=cells, instances_per_cell=instances_per_cell, cells_dir=settings.cells_dir)
    registry.close()
    return settings
