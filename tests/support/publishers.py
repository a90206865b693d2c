"""Real ``Publisher`` implementations for tests: collect, or count while delegating."""

from __future__ import annotations

from collections.abc import Sequence

from cellsight.notifications.envelope import Notification
from cellsight.notifications.errors import PublishError
from cellsight.notifications.publisher import Publisher


class CollectingPublisher:
    """Keeps what it is given, in order."""

    def __init__(self) -> None:
        self.sent: list[Notification] = []

    def publish(self, notification: Notification) -> None:
        self.sent.append(notification)

    def publish_many(self, notifications: Sequence[Notification]) -> None:
        self.sent.extend(notifications)

    @property
    def event_types(self) -> list[str]:
        return [n.event_type for n in self.sent]

    def take(self) -> list[Notification]:
        sent, self.sent = self.sent, []
        return sent


class CountingPublisher:
    """Delegates to a real publisher and counts what it delivered."""

    def __init__(self, inner: Publisher) -> None:
        self.inner = inner
        self.count = 0

    def publish(self, notification: Notification) -> None:
        self.inner.publish(notification)
        self.count += 1

    def publish_many(self, notifications: Sequence[Notification]) -> None:
        self.inner.publish_many(notifications)
        self.count += len(notifications)


class FailingPublisher:
    """The bus is down: every publish raises, as the Notifier does."""

    def __init__(self) -> None:
        self.attempts = 0

    def publish(self, notification: Notification) -> None:
        self.publish_many([notification])

    def publish_many(self, notifications: Sequence[Notification]) -> None:
        self.attempts += 1
        raise PublishError("bus down (test)")
