"""Helpers for indexer tests: a consumer on a thread, and index-vs-cells comparison."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cellsight.cells import reads, rows
from cellsight.cells.mappings import CellRegistry
from cellsight.clients import build_bus, build_consumer_config
from cellsight.indexer.consumer import IndexerConsumer
from cellsight.indexer.documents import comparable, instance_document
from cellsight.indexer.engines.base import SearchEngine
from cellsight.settings import Settings, load_settings
from tests.support.services import RABBITMQ_URL
from tests.support.waiting import wait_for  # noqa: F401  (re-exported)


def bus_settings(data_dir: Path, bus: str, **extra: Any) -> Settings:
    """Settings on RabbitMQ (unique exchange and queues, so tests never share a stream)
    or on the embedded Redis bus in ``data_dir``."""
    if bus == "embedded":
        return load_settings(data_dir=data_dir, **extra)
    tag = uuid.uuid4().hex[:10]
    return load_settings(
        data_dir=data_dir,
        bus_url=RABBITMQ_URL,
        exchange=f"t-nova-{tag}",
        indexer_queue=f"t-idx-{tag}",
        dead_letter_exchange=f"t-dlx-{tag}",
        dead_letter_queue=f"t-dlq-{tag}",
        **extra,
    )


@contextmanager
def running_indexer(
    settings: Settings, engine: SearchEngine, **overrides: Any
) -> Iterator[IndexerConsumer]:
    """An indexer consuming on a thread; stopped (flush, ack, close) on exit."""
    with build_bus(settings) as bus, bus.connection() as connection:
        consumer = IndexerConsumer(
            connection, engine, build_consumer_config(settings, **({"batch_age": 0.05} | overrides))
        )
        thread = threading.Thread(target=consumer.run, daemon=True)
        thread.start()
        try:
            yield consumer
        finally:
            consumer.stop.set()
            thread.join(30)
            assert not thread.is_alive(), "indexer did not stop"


def index_differences(registry: CellRegistry, engine: SearchEngine) -> dict[str, str]:
    """uuid → what differs between each cell row and its document (empty: equal)."""
    engine.refresh("instance")
    diffs: dict[str, str] = {}
    for cell in registry.list_cells():
        with registry.cell_engine(cell).connect() as conn:
            for row in reads.iter_instances(conn):
                payload = rows.row_to_payload(row, cell.uuid)
                want = comparable(instance_document(payload, "instance.update", row["revision"]))
                stored = engine.get("instance", row["uuid"])
                if stored is None:
                    diffs[row["uuid"]] = "missing"
                    continue
                got = comparable(stored.document)
                bad = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
                if bad or stored.version != row["revision"]:
                    diffs[row["uuid"]] = (
                        f"fields {bad}, version {stored.version} vs {row['revision']}"
                    )
    return diffs
