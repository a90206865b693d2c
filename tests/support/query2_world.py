"""Helpers of the query2 tests: index and fan-out apps over one world, expected answers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from fastapi import FastAPI
from fastapi.testclient import TestClient

from cellsight.api.cell_query import row_document
from cellsight.api.query2.evaluate import evaluate
from cellsight.api.query2.sexpr import parse
from cellsight.cells.database import connect
from cellsight.cells.reads import list_compute_nodes
from cellsight.indexer.engines.base import SearchEngine, WriteOp
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.index_roles import marker_key
from cellsight.indexer.row_documents import node_row_document
from tests.support.api_world import World, load_index, make_client

ADMIN = {"X-Auth-Token": "root:admin"}


def node_documents(world: World) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for cell in world.registry.list_cells():
        with connect(world.registry.cell_engine(cell)) as conn:
            out.extend(node_row_document(row, cell.uuid) for row in list_compute_nodes(conn))
    return out


def load_nodes(engine: SearchEngine, world: World) -> None:
    """Node documents as a full sync writes them, and the node index's synced marker."""
    engine.ensure_ready("node")
    docs = node_documents(world)
    engine.bulk([WriteOp("node", d["uuid"], d["version"], d) for d in docs])
    engine.refresh("node")
    serving = next(i.name for i in engine.indexes("node") if i.read)
    engine.put_meta(marker_key("node"), {"resource": "node", "index": serving})


@dataclass
class Pair:
    """The same world behind the index path (``index``) and the fan-out path (``fanout``)."""

    index: TestClient
    fanout: TestClient
    engine: EmbeddedEngine

    def both(self) -> tuple[TestClient, TestClient]:
        return self.index, self.fanout

    def close(self) -> None:
        self.index.close()
        self.fanout.close()
        self.engine.close()


def make_pair(tmp: Path, world: World, **settings: Any) -> Pair:
    engine = EmbeddedEngine(tmp / "index.db", prefix="q2")
    load_index(engine, world)
    load_nodes(engine, world)
    return Pair(
        make_client(tmp / "i", world, engine, **settings),
        make_client(tmp / "f", world, **settings),
        engine,
    )


def instance_documents(world: World) -> list[dict[str, Any]]:
    return [row_document(row, cell).document for cell, row in world.rows()]


def expected_uuids(
    resource: str,
    docs: Sequence[dict[str, Any]],
    raw: Any,
    *,
    project: str | None = None,
) -> list[str]:
    """What a query must return, decided in Python with the tree's semantics."""
    parsed = parse(resource, raw)
    chosen = [
        d
        for d in docs
        if evaluate(parsed.tree, d) is True
        and (resource == "node" or "deleted" in parsed.fields or not d["deleted"])
        and (project is None or d["tenant_id"] == project)
    ]
    return sorted(str(d["uuid"]) for d in chosen)


def state(client: TestClient) -> Any:
    """The ``app.state`` behind a test client."""
    return cast(FastAPI, client.app).state


def query(client: TestClient, resource: str, body: Any, token: dict[str, str] = ADMIN) -> Any:
    return client.post(f"/v2.1/query/{resource}", json=body, headers=token)
