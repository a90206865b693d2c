"""Nova's own payloads carry no cell: the indexer finds it in the API database's
instance mappings (``CellRegistry.cells_of``), wired as ``cellsight indexer`` wires it,
in writer threads and in the writer process alike. An API database that cannot be
reached while the indexer runs is waited out as an engine outage is: the batch stays
unacked and is retried, and the indexer goes on once the database answers (before, the
lookup's ``DatabaseUnavailable`` stopped the indexer)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from cellsight.cells.mappings import CellRegistry
from cellsight.clients import (
    build_bus,
    build_cell_resolver,
    build_consumer_config,
    build_engine,
    build_notifier,
    build_write_side,
)
from cellsight.indexer.consumer import IndexerConsumer
from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.metrics import REGISTRY
from cellsight.notifications.envelope import decode
from cellsight.settings import Settings
from tests.support import novagen
from tests.support.indexing import PIPELINES, bus_settings, consuming, wait_for
from tests.support.proxy import Proxy
from tests.support.services import DatabaseFactory


@contextmanager
def cli_indexer(settings: Settings, engine: SearchEngine) -> Iterator[IndexerConsumer]:
    """The consumer as ``cellsight indexer`` builds it: the cell resolver from the
    settings, and the writer process's own engine and resolver."""
    with build_bus(settings) as bus, bus.connection() as connection:
        consumer = IndexerConsumer(
            connection,
            engine,
            build_consumer_config(settings, batch_age=0.05, max_backoff=0.5),
            cell_resolver=build_cell_resolver(settings),
            write_process=(
                functools.partial(build_write_side, settings) if settings.write_process else None
            ),
        )
        with consuming(consumer):
            yield consumer


def publish_nova(settings: Settings, *instances: str) -> None:
    notifier = build_notifier(settings)
    try:
        for i, instance in enumerate(instances):
            bare = novagen.notification("instance.pause.end", seed=i, uuid_=instance)
            assert "cell_uuid" not in bare["payload"]["nova_object.data"]
            notifier.publish(decode(bare))
    finally:
        notifier.close()


def cell_of(engine: SearchEngine, instance: str) -> object:
    engine.refresh("instance")
    stored = engine.get("instance", instance)
    assert stored is not None, instance
    return stored.document["cell_uuid"]


def retries() -> float:
    return REGISTRY.get_sample_value("cellsight_indexer_retries_total") or 0.0


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_nova_payloads_take_their_cell_from_the_instance_mappings(
    pipeline: str, tmp_path: Path
) -> None:
    settings = bus_settings(tmp_path / "data", "embedded", write_process=pipeline == "process")
    registry = CellRegistry.from_settings(settings)
    cell = registry.add_cell("cell1", f"sqlite:///{tmp_path / 'cell1.db'}")
    mapped, unmapped = str(uuid.uuid4()), str(uuid.uuid4())
    registry.map_instances(cell.uuid, [(mapped, "project", "user")])
    engine = build_engine(settings)
    publish_nova(settings, mapped, unmapped)
    with cli_indexer(settings, engine) as consumer:
        wait_for(lambda: consumer.acked >= 2, what="both notifications acked")
    assert consumer.totals["indexed"] == 2
    assert cell_of(engine, mapped) == cell.uuid
    assert cell_of(engine, unmapped) is None
    engine.close()
    registry.close()


@pytest.mark.services
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_an_unreachable_api_database_is_waited_out(
    pipeline: str, make_database: DatabaseFactory, tmp_path: Path
) -> None:
    direct = sa.make_url(make_database("postgresql"))
    proxy = Proxy((direct.host or "127.0.0.1", direct.port or 5432))
    proxy.start()
    try:
        through = direct.set(host="127.0.0.1", port=proxy.port)
        settings = bus_settings(
            tmp_path / "data",
            "embedded",
            write_process=pipeline == "process",
            api_db_url=through.render_as_string(hide_password=False),
            db_connect_timeout=2.0,
        )
        registry = CellRegistry.from_settings(settings)
        cell = registry.add_cell("cell1", f"sqlite:///{tmp_path / 'cell1.db'}")
        instance = str(uuid.uuid4())
        registry.map_instances(cell.uuid, [(instance, "project", "user")])
        registry.close()
        engine = build_engine(settings)
        with cli_indexer(settings, engine) as consumer:
            proxy.stop()  # the indexer is up: an outage while it runs
            before = retries()
            publish_nova(settings, instance)
            wait_for(lambda: retries() >= before + 2, what="the cell lookup retried")
            assert consumer.acked == 0, "acked before its cell was known"
            proxy.start()
            wait_for(lambda: consumer.acked >= 1, what="indexed once the database answers")
        assert consumer.totals["indexed"] == 1
        assert cell_of(engine, instance) == cell.uuid
        engine.close()
    finally:
        proxy.stop()
