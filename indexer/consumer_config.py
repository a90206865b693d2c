"""The indexer consumer's names, batching and bounds (built from the settings by
``clients.build_consumer_config``)."""

from __future__ import annotations

from dataclasses import dataclass

from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.inflight import default_in_flight
from cellsight.settings import MAX_PREFETCH


@dataclass(frozen=True)
class ConsumerConfig:
    exchange: str = "nova"
    queue: str = "cellsight.indexer"
    dead_letter_exchange: str = "cellsight.dlx"
    dead_letter_queue: str = "cellsight.dlq"
    batch_count: int = 1000
    batch_bytes: int = 10 * 1024 * 1024
    batch_age: float = 0.2
    prefetch: int = 2000
    held_bytes: int = 128 * 1024 * 1024  # of bodies received and not yet settled (intake)
    max_backoff: float = 30.0  # seconds between write retries while the engine is down
    max_in_flight: int = 0  # bulk writes at once; 0: 1 on the embedded engine, 5 on HTTP

    def in_flight_for(self, engine: SearchEngine) -> int:
        return self.max_in_flight or default_in_flight(engine.distribution)

    def prefetch_for(self, in_flight: int) -> int:
        """Room for every batch in flight, one decoded and waiting, one being received:
        with less, receiving stalls until a write is acked and the overlap is lost. At
        most AMQP's 16-bit ``prefetch_count``: past it, batches end by age, not count."""
        return min(MAX_PREFETCH, max(self.prefetch, self.batch_count * (in_flight + 2)))
