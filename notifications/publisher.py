"""The interface producers depend on; ``Notifier`` is the bus implementation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cellsight.notifications.envelope import Notification


class Publisher(Protocol):
    def publish(self, notification: Notification) -> None:
        """Deliver one notification or raise ``PublishError``; never drop it silently."""

    def publish_many(self, notifications: Sequence[Notification]) -> None:
        """Deliver several (confirmed together where the bus allows) or raise ``PublishError``."""
