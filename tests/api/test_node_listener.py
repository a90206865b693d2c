"""The API's node cache hears operations run by another process, on the embedded bus and
on RabbitMQ: their compute-node notifications drop exactly the nodes they changed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kombu import Producer

from cellsight.api.fanout import FanOut
from cellsight.api.node_listener import start_listener
from cellsight.api.query2.node_cache import NodeCache
from cellsight.api.query2.nodes import _from_cells
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.nodeevents import register_node, set_node_state
from cellsight.cells.operations import Operations
from cellsight.clients import build_bus, build_notifier, notifications_exchange
from tests.support.indexing import bus_settings


class Watched(NodeCache):
    """A node cache that signals each observed event (tests wait on it, not on time)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.heard = threading.Event()

    def observe(self, event_type: str, payload: Any) -> None:
        super().observe(event_type, payload)
        self.heard.set()


@pytest.fixture(params=["embedded", "rabbitmq"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "rabbitmq":
        request.getfixturevalue("rabbitmq_url")  # skips, or fails under REQUIRE_SERVICES
    return bus_settings(tmp_path / "data", request.param)


@contextmanager
def listening(settings: Any, tmp_path: Path) -> Iterator[tuple[CellRegistry, Watched]]:
    """A cluster of one SQLite cell and an API node cache whose listener is bound."""
    registry = CellRegistry(f"sqlite:///{tmp_path / 'api.db'}")
    registry.create_schema()
    registry.add_cell("cell1", f"sqlite:///{tmp_path / 'cell1.db'}")
    fanout = FanOut(cell_timeout=5.0)
    cache = Watched(registry.list_cells, lambda cells: _from_cells(list(cells), fanout))
    ready, stop = start_listener(settings, cache)
    try:
        assert ready.wait(30), "listener did not bind its queue"
        yield registry, cache
    finally:
        stop.set()
        fanout.close()
        registry.close()


def test_a_node_event_from_another_process_drops_that_node(settings: Any, tmp_path: Path) -> None:
    with listening(settings, tmp_path) as (registry, cache), build_notifier(settings) as notifier:
        ops = Operations(registry, notifier, publisher_id="elsewhere")
        register_node(ops, "cell1", "h1")
        assert cache.heard.wait(30)
        before = cache.get()
        assert [d["offline"] for d in before.documents] == [False]
        cache.heard.clear()
        set_node_state(ops, "cell1", "h1", offline=True)
        assert cache.heard.wait(30), "the notification never reached the API"
        assert cache.invalidations >= 1
        assert [d["offline"] for d in cache.get().documents] == [True]


def test_the_listener_goes_on_after_a_message_it_cannot_decode(
    settings: Any, tmp_path: Path
) -> None:
    """A body kombu refuses to decode (a content type other than JSON) is skipped; on the
    code before, it raised out of the listener's receive and the listener stopped."""
    with listening(settings, tmp_path) as (registry, cache):
        with build_bus(settings) as bus, bus.connection() as conn:
            exchange = notifications_exchange(settings)
            Producer(conn.channel()).publish(
                b"\xff not json",
                exchange=exchange,
                routing_key="versioned_notifications.info",
                content_type="text/plain",
                content_encoding="binary",
                declare=[exchange],
            )
        with build_notifier(settings) as notifier:
            register_node(Operations(registry, notifier, publisher_id="elsewhere"), "cell1", "h1")
            assert cache.heard.wait(30), "the listener stopped at the undecodable message"


def test_the_listener_keeps_its_connection_with_heartbeats(
    tmp_path: Path, rabbitmq_url: str
) -> None:
    """With ``?heartbeat=2`` on the bus URL the listener sends heartbeats: it never did,
    and the broker closed it after two silent intervals, which stopped it for good (the
    cache then expires by TTL only; a review found it). Idle for 3.5 intervals, it
    still hears a node event."""
    settings = bus_settings(tmp_path / "data", "rabbitmq")
    settings = settings.model_copy(update={"bus_url": f"{rabbitmq_url}?heartbeat=2"})
    with listening(settings, tmp_path) as (registry, cache):
        threading.Event().wait(7.0)  # the broker's own timer: two silent intervals
        assert any(t.name == "node-cache-listener" for t in threading.enumerate())
        with build_notifier(settings) as notifier:
            register_node(Operations(registry, notifier, publisher_id="elsewhere"), "cell1", "h1")
            assert cache.heard.wait(30), "the listener lost its connection"


def test_the_listener_goes_on_after_a_node_event_whose_payload_is_another_class(
    settings: Any, tmp_path: Path
) -> None:
    """An adversarial probe: a ``compute_node.update`` carrying a ``Selection`` (or any
    other class) raised out of the cache's observe (it has no node uuid) and ended the
    listener; every later change then waited out the cache's TTL (ten minutes)."""
    from cellsight.notifications.envelope import Notification
    from cellsight.notifications.objects import Selection

    with listening(settings, tmp_path) as (registry, cache), build_notifier(settings) as notifier:
        ops = Operations(registry, notifier, publisher_id="elsewhere")
        node = register_node(ops, "cell1", "h1")
        assert cache.heard.wait(30)
        assert [d["offline"] for d in cache.get().documents] == [False]
        cache.heard.clear()
        assert node.cell_uuid is not None
        odd = Selection.from_allocation(
            compute_node_uuid=node.uuid,
            service_host="h1",
            nodename="h1",
            cell_uuid=node.cell_uuid,
            allocation=None,
        )
        notifier.publish(Notification.create("compute_node.update", "elsewhere", odd))
        assert cache.heard.wait(30), "the listener stopped at the odd payload"
        assert [d["offline"] for d in cache.get().documents] == [False]  # nothing dropped
        cache.heard.clear()
        set_node_state(ops, "cell1", "h1", offline=True)
        assert cache.heard.wait(30), "the listener stopped at the odd payload"
        assert [d["offline"] for d in cache.get().documents] == [True]
