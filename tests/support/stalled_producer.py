"""A producer process that commits an operation, then stalls before publishing.

Run as ``python -m tests.support.stalled_producer NAME`` with the usual ``CELLSIGHT_*``
environment: it boots one instance named NAME through the real ``Operations`` and the
real ``Notifier``, prints ``COMMITTED <uuid>`` once the cell transaction committed, and
sleeps where the publish would start, for the test to SIGKILL it there.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.operations import Operations
from cellsight.cells.outbox import Outbox
from cellsight.clients import build_notifier
from cellsight.notifications.envelope import Notification
from cellsight.notifications.notifier import Notifier
from cellsight.settings import load_settings


class StallingPublisher:
    def __init__(self, inner: Notifier) -> None:
        self.inner = inner

    def publish(self, notification: Notification) -> None:
        self.publish_many([notification])

    def publish_many(self, notifications: Sequence[Notification]) -> None:
        print("COMMITTED", flush=True)
        time.sleep(3600)  # killed here, between the commit and the publish
        self.inner.publish_many(notifications)


def main() -> None:
    settings = load_settings()
    registry = CellRegistry.from_settings(settings)
    with build_notifier(settings) as notifier:
        publisher = StallingPublisher(notifier)
        relay = Outbox(publisher, lease_seconds=settings.outbox_lease)
        ops = Operations(registry, publisher, publisher_id="stalled", relay=relay)
        ops.boot(BootRequest(sys.argv[1], "m1.small", "p1", "u1"))


if __name__ == "__main__":
    main()
