"""Prometheus metrics of the indexer. One registry per process, exposed on a port."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from cellsight.notifications.event_types import KNOWN_EVENT_TYPES

REGISTRY = CollectorRegistry()

CONSUMED = Counter("cellsight_indexer_consumed", "Messages consumed", registry=REGISTRY)
INDEXED = Counter("cellsight_indexer_indexed", "Documents written", ["resource"], registry=REGISTRY)
STALE = Counter(
    "cellsight_indexer_stale",
    "Events older than the stored document (duplicates, reordering, purge floor)",
    ["resource"],
    registry=REGISTRY,
)
IGNORED = Counter(
    "cellsight_indexer_ignored",
    "Events with no document (e.g. service.update), by event type: Nova's own always, "
    "others past the first IGNORED_EVENT_TYPES as 'other'",
    ["event_type"],
    registry=REGISTRY,
)
# The event type is the publisher's text: a label per value would let any publisher grow
# the process and its /metrics page without end (an adversarial probe: 20,000 made-up
# event types, 12 MB of /metrics). Nova's documented ones (about 130) always keep their
# label, so made-up ones arriving first cannot push them into "other".
IGNORED_EVENT_TYPES = 256
OTHER = "other"
_ignored_labels: set[str] = set()


def ignored_label(event_type: str) -> str:
    """``event_type`` if Nova or Cellsight sends it, or while fewer than
    ``IGNORED_EVENT_TYPES`` others have been seen; else ``OTHER`` (a racing thread may add
    one or two past the cap: bounded all the same)."""
    if event_type in KNOWN_EVENT_TYPES or event_type in _ignored_labels:
        return event_type
    if len(_ignored_labels) >= IGNORED_EVENT_TYPES:
        return OTHER
    _ignored_labels.add(event_type)
    return event_type


DEAD_LETTERED = Counter(
    "cellsight_indexer_dead_lettered",
    "Messages sent to the dead-letter queue",
    ["reason"],
    registry=REGISTRY,
)
RETRIES = Counter(
    "cellsight_indexer_retries", "Bulk writes retried after a transient failure", registry=REGISTRY
)
BATCH_SIZE = Histogram(
    "cellsight_indexer_batch_size",
    "Messages per flushed batch",
    buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000),
    registry=REGISTRY,
)
BATCH_SECONDS = Histogram(
    "cellsight_indexer_batch_seconds", "Time to process and ack one batch", registry=REGISTRY
)
LAG_SECONDS = Histogram(
    "cellsight_indexer_lag_seconds",
    "From a notification's timestamp to its write",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
    registry=REGISTRY,
)
UNSETTLED_SECONDS = Gauge(
    "cellsight_indexer_unsettled_seconds",
    "Age of the oldest batch written or being written and not yet acked (0: none)",
    registry=REGISTRY,
)
HELD_BYTES = Gauge(
    "cellsight_indexer_held_bytes",
    "Bytes of message bodies received and not yet settled (bound: CELLSIGHT_HELD_BYTES)",
    registry=REGISTRY,
)
HANDED_BACK = Counter(
    "cellsight_indexer_handed_back",
    "Messages rejected with requeue because the worker held its bound of bytes",
    registry=REGISTRY,
)
ENGINE_UP = Gauge(
    "cellsight_indexer_engine_up", "1 while the engine accepts writes", registry=REGISTRY
)


def serve(port: int) -> None:
    start_http_server(port, registry=REGISTRY)
