"""The transactional outbox on every cell dialect: notifications commit with the change,
survive a bus failure, are relayed in order, and two relays never interleave a cell."""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any, cast

import pytest
import sqlalchemy as sa

from cellsight.cells import outbox
from cellsight.cells.database import connect
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.operations import Operations
from cellsight.cells.outbox import Outbox
from cellsight.cells.relay_loop import BACKOFF_MAX, CellBackoff, relay_cells, start_periodic_relay
from cellsight.notifications.envelope import Notification
from cellsight.notifications.notifier import Notifier, RetryPolicy
from cellsight.notifications.payloads import InstancePayload
from tests.support.publishers import CollectingPublisher, FailingPublisher
from tests.support.refusals import MESSAGE, refuse_deletes


def waiting(registry: CellRegistry, cell: CellMapping) -> int:
    with connect(registry.cell_engine(cell)) as conn:
        return outbox.pending(conn)


def boot(ops: Operations, name: str = "web") -> str:
    result = ops.boot(BootRequest(name, "m1.small", "p1", "u1"))
    return result.instances[0].uuid


# One instance booted: create.start, update, create.end, then its node's compute_node.update.
BOOT_EVENTS = 4


def revisions(sent: Sequence[Notification]) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = {}
    for n in sent:
        payload: Any = n.payload
        seen.setdefault(payload.uuid, []).append(payload.revision)
    return seen


def test_operations_publish_through_the_outbox_and_leave_it_empty(
    ops: Operations, registry: CellRegistry, cell: CellMapping, publisher: CollectingPublisher
) -> None:
    uuid = boot(ops)
    ops.rename(uuid, "web-2")
    assert publisher.event_types == [
        "instance.create.start",
        "instance.update",
        "instance.create.end",
        "compute_node.update",
        "instance.update",
    ]
    first = publisher.sent[0]
    assert first.message_id and first.timestamp  # stamped when written, kept on republish
    assert waiting(registry, cell) == 0


def test_a_failed_publish_keeps_the_committed_notifications_for_the_relay(
    registry: CellRegistry, cell: CellMapping
) -> None:
    down = FailingPublisher()
    ops = Operations(registry, down, publisher_id="t")
    uuid = boot(ops)  # committed although the bus is down: no exception
    ops.power_off(uuid)
    assert down.attempts >= 2
    waited = waiting(registry, cell)
    assert waited >= 4  # create.start, update, create.end, power_off's

    up = CollectingPublisher()
    reports = relay_cells(registry, Outbox(up))
    assert reports[cell.name].published == waited and reports[cell.name].error is None
    assert up.event_types[:3] == [
        "instance.create.start",
        "instance.update",
        "instance.create.end",
    ]
    assert "instance.power_off.end" in up.event_types[3:]
    assert revisions(up.sent)[uuid] == sorted(revisions(up.sent)[uuid])
    assert waiting(registry, cell) == 0
    again = relay_cells(registry, Outbox(up))
    assert again[cell.name].published == 0


def test_a_rolled_back_operation_leaves_nothing_in_the_outbox(
    registry: CellRegistry, cell: CellMapping
) -> None:
    def fail(action: str, conn: sa.Connection) -> None:
        raise RuntimeError(f"fail {action}")

    publisher = CollectingPublisher()
    ops = Operations(registry, publisher, before_commit=fail)
    with pytest.raises(RuntimeError):
        boot(ops)
    assert waiting(registry, cell) == 0
    assert publisher.sent == []


def test_a_relay_that_cannot_publish_keeps_every_row_and_releases_the_lease(
    registry: CellRegistry, cell: CellMapping
) -> None:
    boot(Operations(registry, FailingPublisher()))
    report = Outbox(FailingPublisher()).relay(registry.cell_engine(cell))
    assert report.error and report.published == 0 and report.left == BOOT_EVENTS
    # The lease was released: another relay gets it at once, not after expiry.
    up = CollectingPublisher()
    assert Outbox(up).relay(registry.cell_engine(cell)).published == BOOT_EVENTS


def test_a_held_lease_makes_another_relay_wait_until_it_expires(
    registry: CellRegistry, cell: CellMapping
) -> None:
    boot(Operations(registry, FailingPublisher()))
    engine = registry.cell_engine(cell)
    holder = Outbox(CollectingPublisher(), lease_seconds=3600, holder="stuck")
    assert holder._acquire(engine)  # a relay that took the lease and died
    other = Outbox(CollectingPublisher())
    assert other.relay(engine).busy
    assert waiting(registry, cell) == BOOT_EVENTS
    expired = Outbox(CollectingPublisher(), lease_seconds=0.0, holder="stuck")
    assert expired._acquire(engine)  # renewed by its holder with no time left
    later = CollectingPublisher()
    assert Outbox(later).relay(engine).published == BOOT_EVENTS


def test_two_relays_at_once_publish_each_instance_in_revision_order(
    registry: CellRegistry, cell: CellMapping
) -> None:
    ops = Operations(registry, FailingPublisher(), publisher_id="t")
    uuids = [boot(ops, f"vm{i}") for i in range(3)]
    for round_ in range(4):
        for uuid in uuids:
            ops.rename(uuid, f"name-{round_}")
    total = waiting(registry, cell)
    assert total == 3 * BOOT_EVENTS + 12

    shared = CollectingPublisher()
    lock = threading.Lock()

    class Recording:
        def publish(self, notification: Notification) -> None:
            self.publish_many([notification])

        def publish_many(self, notifications: Sequence[Notification]) -> None:
            with lock:
                shared.publish_many(notifications)

    relays = [Outbox(Recording(), batch=2) for _ in range(2)]
    errors: list[BaseException] = []

    def run(relay: Outbox) -> None:
        try:
            while waiting(registry, cell):
                relay.relay(registry.cell_engine(cell))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in relays]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(shared.sent) == total  # neither relay published a row twice
    for uuid, seen in revisions(shared.sent).items():
        assert seen == sorted(seen), uuid


def test_large_and_astral_notifications_round_trip_through_the_outbox(
    registry: CellRegistry, cell: CellMapping
) -> None:
    # 300 x 255-character values: a body far above MariaDB's 64 KB TEXT (LONGTEXT here),
    # with characters outside the BMP (4-byte UTF-8, MySQL's utf8mb4).
    ops = Operations(registry, FailingPublisher())
    uuid = boot(ops, "\U0001f600-\u00e9-name")
    metadata = {f"k{i:03d}": ("\U0001f600" + "x" * 254) for i in range(300)}
    ops.update_metadata(uuid, metadata)
    up = CollectingPublisher()
    report = Outbox(up).relay(registry.cell_engine(cell))
    assert report.error is None and report.published == len(up.sent) >= 4
    last: Any = up.sent[-1].payload
    assert last.metadata == metadata
    first: Any = up.sent[0].payload
    assert first.display_name == "\U0001f600-\u00e9-name"


def test_the_periodic_relay_delivers_what_producers_left(
    registry: CellRegistry, cell: CellMapping
) -> None:
    boot(Operations(registry, FailingPublisher()))
    up = CollectingPublisher()
    stop = threading.Event()
    thread = start_periodic_relay(registry, Outbox(up), 0.05, stop)
    try:
        deadline = time.monotonic() + 30
        while waiting(registry, cell) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert waiting(registry, cell) == 0
    assert up.event_types[0] == "instance.create.start" and len(up.sent) == BOOT_EVENTS


def test_an_undelivered_notification_is_told_by_its_instance(
    registry: CellRegistry, cell: CellMapping, caplog: pytest.LogCaptureFixture
) -> None:
    # The Notifier names a notification it could not deliver by its message id; what an
    # operator looks up is the instance (the message id stays, labelled).
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    retry: RetryPolicy = {"max_retries": 1, "interval_start": 0.1, "interval_step": 0.1}
    with Notifier(f"amqp://guest:guest@127.0.0.1:{port}//", timeout=1.0, retry_policy=retry) as bus:
        with caplog.at_level(logging.WARNING, logger="cellsight.cells.outbox"):
            uuid = boot(Operations(registry, bus, publisher_id="t"))
        told = re.compile(
            rf"instance\.create\.start of instance {uuid} \(message [0-9a-f-]{{36}}\) "
            "not delivered to exchange 'nova'"
        )
        assert told.search(caplog.text), caplog.text
        report = Outbox(bus).relay(registry.cell_engine(cell))
    assert report.error and told.search(report.error), report.error
    assert report.left == BOOT_EVENTS


def test_a_publisher_that_names_no_message_gets_the_first_of_the_batch(
    registry: CellRegistry, cell: CellMapping
) -> None:
    uuid = boot(Operations(registry, FailingPublisher()))
    report = Outbox(FailingPublisher()).relay(registry.cell_engine(cell))
    assert report.error is not None
    assert report.error.startswith(f"instance.create.start of instance {uuid} (message ")
    assert report.error.endswith(
        f"and the {BOOT_EVENTS - 1} after it not delivered: bus down (test)"
    )


def test_a_notification_the_relay_could_not_read_is_refused_at_commit(
    registry: CellRegistry, cell: CellMapping
) -> None:
    """An adversarial probe: a publisher_id over 255 characters was written into the
    outbox, which the relay's decoder refuses; every row after it then waited for good
    while each operation committed and exited 0. The operation fails now, its
    transaction rolled back, and the outbox keeps moving."""
    from cellsight.notifications.errors import NotificationError

    publisher = CollectingPublisher()
    with pytest.raises(NotificationError, match="255"):
        boot(Operations(registry, publisher, publisher_id="p" * 256))
    assert waiting(registry, cell) == 0 and publisher.sent == []
    with connect(registry.cell_engine(cell)) as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM instances")).scalar_one() == 0
    boot(Operations(registry, publisher))
    assert waiting(registry, cell) == 0 and len(publisher.sent) == BOOT_EVENTS


def test_a_delivery_with_a_time_budget_leaves_the_rest_in_order(
    registry: CellRegistry, cell: CellMapping
) -> None:
    """``deliver_budget`` (the API's requests): a delivery stops after the batch that
    reached its budget, releases the lease, and the rest goes with the next pass in the
    same order. A budget of 0 is exactly one batch."""
    down = Operations(registry, FailingPublisher())
    uuids = [boot(down, f"web-{i}") for i in range(3)]
    engine = registry.cell_engine(cell)
    backlog = waiting(registry, cell)
    assert backlog == 3 * BOOT_EVENTS
    up = CollectingPublisher()
    report = Outbox(up, batch=5, deliver_budget=0.0).deliver(engine)
    assert (report.published, report.more, report.error) == (5, True, None)
    assert waiting(registry, cell) == backlog - 5
    rest = Outbox(up, batch=5).relay(engine)  # the lease was released: no wait
    assert (rest.published, rest.more, rest.busy) == (backlog - 5, False, False)
    assert waiting(registry, cell) == 0
    # Every notification once, in commit order: each boot's in turn, its node's last.
    assert len(up.sent) == backlog
    instances = [
        cast(InstancePayload, n.payload).uuid
        for n in up.sent
        if n.event_type.startswith("instance.")
    ]
    assert instances == [u for u in uuids for _ in range(BOOT_EVENTS - 1)]
    assert [n.event_type for n in up.sent[:BOOT_EVENTS]] == [
        "instance.create.start",
        "instance.update",
        "instance.create.end",
        "compute_node.update",
    ]


@pytest.mark.parametrize("interval", [float("inf"), float("nan"), 1e10, 0.0, -1.0])
def test_the_periodic_relay_refuses_an_interval_no_wait_can_take(
    registry: CellRegistry, interval: float
) -> None:
    # Before, the thread started and died at its first wait (OverflowError past
    # TIMEOUT_MAX), while `outbox relay --every inf` waited for it for ever.
    stop = threading.Event()
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(ValueError, match="relay interval"):
        start_periodic_relay(registry, Outbox(CollectingPublisher()), interval, stop)
    assert "outbox-relay" not in {t.name for t in threading.enumerate()} - before


class TimedPublisher(CollectingPublisher):
    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def publish_many(self, notifications: Sequence[Notification]) -> None:
        self.times.append(time.monotonic())
        super().publish_many(notifications)


def test_a_batch_published_and_not_deleted_is_reported_and_its_cell_backed_off(
    registry: CellRegistry, cell: CellMapping, dialect: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A probe: with a cell's disk full, the periodic relay published the same batch again
    at every pass (the bus grew by a hundred messages a pass, the outbox not at all)."""
    boot(Operations(registry, FailingPublisher()))
    refuse_deletes(registry.cell_engine(cell), "outbox", dialect)
    report = Outbox(CollectingPublisher()).relay(registry.cell_engine(cell))
    assert report.unremoved == BOOT_EVENTS and report.left == BOOT_EVENTS
    assert report.error is not None and "published but not removed" in report.error
    assert MESSAGE in report.error and "DELETE" not in report.error
    up = TimedPublisher()
    stop = threading.Event()
    with caplog.at_level(logging.WARNING, logger="cellsight.cells.relay_loop"):
        thread = start_periodic_relay(registry, Outbox(up), 0.05, stop)
        try:
            deadline = time.monotonic() + 30
            while len(up.times) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            stop.set()
            thread.join(10)
    assert len(up.times) >= 4
    # Each pass at the cell waits twice as long as the last: 0.1, 0.2, 0.4 s (every
    # 0.05 s without the backoff).
    gaps = [b - a for a, b in zip(up.times, up.times[1:], strict=False)]
    assert all(gap >= 0.05 * 2 ** (i + 1) - 0.01 for i, gap in enumerate(gaps[:3])), gaps
    assert "next pass at this cell in 0.1 s" in caplog.text
    assert waiting(registry, cell) == BOOT_EVENTS  # nothing lost meanwhile


def test_the_relay_backoff_doubles_to_its_cap_and_forgets_a_cell_that_recovers() -> None:
    now = [1000.0]
    backoff = CellBackoff(2.0, clock=lambda: now[0])
    assert backoff.due(["a", "b"]) == ["a", "b"]
    waits = []
    for _ in range(2000):  # days of a full disk: past a float's 2**1024
        backoff.record("a", failed=True)
        waits.append(backoff._next["a"] - now[0])
    assert waits[:4] == [4.0, 8.0, 16.0, 32.0] and waits[-1] == BACKOFF_MAX
    assert backoff.due(["a", "b"]) == ["b"]
    now[0] += BACKOFF_MAX
    assert backoff.due(["a", "b"]) == ["a", "b"]
    backoff.record("a", failed=False)
    backoff.record("a", failed=True)
    assert backoff._next["a"] - now[0] == 4.0  # started afresh
