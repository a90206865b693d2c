"""A one-shot outbox relay interrupted (Ctrl-C, or SIGTERM raised as it) stops at its
cells' next batch and gives their leases back, on every dialect."""

from __future__ import annotations

import signal
import threading
from collections.abc import Sequence
from typing import Any

import pytest
import sqlalchemy as sa

from cellsight.cells import outbox
from cellsight.cells.database import connect
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.operations import Operations
from cellsight.cells.outbox import Outbox
from cellsight.cells.relay_loop import relay_cells
from cellsight.notifications.envelope import Notification, decode
from tests.cells.test_outbox import BOOT_EVENTS
from tests.support.publishers import CollectingPublisher, FailingPublisher


def _pending_notifications(registry: CellRegistry, cell: CellMapping) -> list[Notification]:
    with connect(registry.cell_engine(cell)) as conn:
        return [decode(body) for (body,) in conn.execute(sa.select(outbox.outbox.c.body))]


def test_an_interrupted_relay_stops_at_its_next_batch_and_gives_its_leases_back(
    registry: CellRegistry, cell: CellMapping, add_cell: Any
) -> None:
    """An interrupt probe: Ctrl-C during a one-shot `outbox relay` of several cells went
    on relaying every cell's whole backlog (the pool's exit waited for its threads)
    before saying "interrupted". The threads stop after their batch, leases released."""
    other = add_cell("cell2")
    for target in (cell, other):
        ops = Operations(registry, FailingPublisher())
        for i in range(5):
            ops.boot(BootRequest(f"web-{i}", "m1.small", "p1", "u1", cell=target.name))
    main = threading.get_ident()

    class InterruptingAtFirst(CollectingPublisher):
        def publish_many(self, notifications: Sequence[Notification]) -> None:
            super().publish_many(notifications)
            if len(self.sent) == len(notifications):  # the first batch of all
                signal.pthread_kill(main, signal.SIGINT)
                relay.stop.wait(10)  # until the main thread has taken the interrupt

    everything = [n for target in (cell, other) for n in _pending_notifications(registry, target)]
    published = InterruptingAtFirst()
    relay = Outbox(published, batch=1)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            relay_cells(registry, relay)
    finally:
        signal.signal(signal.SIGINT, previous)
    total = 2 * 5 * BOOT_EVENTS
    assert len(published.sent) < total // 2  # each cell stopped at its next batch
    relaying = [t for t in threading.enumerate() if t.name.startswith("outbox-relay")]
    for thread in relaying:
        # One that the interrupt met in its start() never ran (no ident): nothing to join.
        if thread.ident is not None:
            thread.join(10)
    rest = CollectingPublisher()
    reports = relay_cells(registry, Outbox(rest))  # the leases are free at once
    assert not any(r.busy for r in reports.values())
    assert {n.message_id for n in [*published.sent, *rest.sent]} == {
        n.message_id for n in everything
    }
