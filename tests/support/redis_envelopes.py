"""Envelopes and dead letters on the embedded Redis bus, for the tests of what its
channel cannot read (``notifications.redis_transport``, ``notifications.redis_envelopes``):
a real kombu envelope, changed at a place, and the dead letters as ``dlq`` reads them.

The ``settings_`` fixture is ``embedded_settings``, registered by tests/indexer's conftest."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cellsight.clients import build_bus
from cellsight.indexer.dlq import DeadLetter, peek
from cellsight.settings import Settings
from tests.support import novagen, poison
from tests.support.indexing import bus_settings, embedded_redis, publish_bodies

KEY = "versioned_notifications.info"


def an_envelope(settings: Settings) -> dict[str, Any]:
    """A real kombu envelope of a good notification, taken off the list as it was put."""
    publish_bodies(settings, [novagen.body(poison.good(seed=99))])
    with embedded_redis(settings) as client:
        item = client.rpop(settings.indexer_queue)
    assert isinstance(item, bytes)
    envelope: dict[str, Any] = json.loads(item)
    return envelope


def broken(envelope: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> bytes:
    """``envelope`` as the bytes on the list, ``change`` made to a copy of it."""
    copy = json.loads(json.dumps(envelope))
    change(copy)
    return json.dumps(copy).encode()


def set_field(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change that sets ``value`` at ``path`` (dotted: ``properties.delivery_tag``)."""
    *parents, last = path.split(".")

    def change(envelope: dict[str, Any]) -> None:
        target = envelope
        for name in parents:
            target = target[name]
        target[last] = value

    return change


@pytest.fixture(name="settings_")
def embedded_settings(tmp_path: Path) -> Settings:
    return bus_settings(tmp_path / "data", "embedded")


def letters(settings: Settings) -> list[DeadLetter]:
    with build_bus(settings) as bus, bus.connection() as conn:
        return list(peek(conn, settings.dead_letter_exchange, settings.dead_letter_queue, 1000))
