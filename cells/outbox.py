"""The transactional outbox: a committed change never loses its notification.

A producer writes its notifications with ``add(conn, notifications)`` inside the same
cell transaction as the change; they commit or roll back together. After the commit,
``Outbox.deliver(engine)`` publishes them with publisher confirms (the ``Publisher``,
normally the ``Notifier``) and deletes them. Whatever could not be published then (bus
down, process killed between commit and publish) stays in the table and is published
later by ``Outbox.relay`` (``cellsight outbox relay``, or periodically by the indexer),
at least once.

Order: rows are published in id order, one relay per cell at a time. The relay that
holds the cell's lease (a row of ``outbox_lease`` updated under the cell's write lock:
``SELECT … FOR UPDATE`` on PostgreSQL/MariaDB, ``BEGIN IMMEDIATE`` on SQLite) is the
only one publishing; a relay that dies loses the lease when it expires and the next
one republishes from the oldest undeleted row. A relay stalled past its lease may
publish a row a second time; the index's external versions absorb duplicates.

Any operation, in any module::

    with write_transaction(engine) as conn:
        ...change rows...
        outbox.add(conn, events)
    outbox_relay.deliver(engine)
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from cellsight.cells.database import connect, first_line, write_transaction
from cellsight.cells.errors import CellsError, DatabaseUnavailable
from cellsight.cells.schema import outbox, outbox_lease, utcnow
from cellsight.notifications.envelope import Notification, decode
from cellsight.notifications.errors import NotificationError, PublishError
from cellsight.notifications.notifier import stamped
from cellsight.notifications.publisher import Publisher

log = logging.getLogger(__name__)

LEASE_NAME = "relay"


def add(conn: sa.Connection, notifications: Iterable[Notification]) -> list[int]:
    """Write ``notifications`` into the outbox, inside the caller's open transaction.

    Each gets its ``message_id`` and ``timestamp`` now, so a republish is the same
    message. Returns the new row ids.
    """
    ids: list[int] = []
    now = utcnow()
    for notification in notifications:
        key = conn.execute(outbox.insert().values(**_row(notification, now))).inserted_primary_key
        assert key is not None
        ids.append(int(key[0]))
    return ids


def add_many(conn: sa.Connection, notifications: Sequence[Notification]) -> None:
    """``add`` in one ``executemany`` (a bulk load's chunk), without the row ids."""
    now = utcnow()
    if notifications:
        conn.execute(outbox.insert(), [_row(n, now) for n in notifications])


def _row(notification: Notification, now: datetime) -> dict[str, Any]:
    notification = stamped(notification)
    uuid = getattr(notification.payload, "uuid", None)
    body = json.dumps(notification.to_dict())
    # What the relay cannot read it cannot publish, and the rows behind it wait too: a
    # value the contract refuses (a publisher_id over 255 characters, a time past year
    # 9999 in UTC) fails here, in the caller's transaction, which then rolls back.
    decode(body)
    return {
        "instance_uuid": uuid if isinstance(uuid, str) else None,
        "event_type": notification.event_type,
        "body": body,
        "created_at": now,
    }


def pending(conn: sa.Connection) -> int:
    """How many notifications wait in this cell's outbox."""
    return int(conn.execute(sa.select(sa.func.count()).select_from(outbox)).scalar_one())


def ensure_tables(engine: sa.Engine) -> None:
    """Create the outbox tables in a cell created before they existed. Through
    ``connect``, so a cell that cannot be reached is ``DatabaseUnavailable`` here as in
    every other read of it (``outbox status`` named the driver's error and stopped)."""
    with connect(engine) as conn, conn.begin():
        outbox.create(conn, checkfirst=True)
        outbox_lease.create(conn, checkfirst=True)


def subject(notification: Notification) -> str:
    """What a notification is about, as an operator looks it up: ``instance <uuid>``."""
    uuid = getattr(notification.payload, "uuid", None)
    return f"{notification.event.object} {uuid}" if uuid else notification.event.object


def undelivered(error: str, notifications: Sequence[Notification]) -> str:
    """A publisher's error with the notification it names by message id told by its
    subject (the ``Notifier`` says ``instance.create.start <message id> not delivered``):
    ``instance.create.start of instance <uuid> (message <message id>) not delivered``.
    A publisher that names none gets the first of the batch, whose rows all stay."""
    for notification in notifications:
        named = f"{notification.event_type} {notification.message_id}"
        if notification.message_id and named in error:
            told = (
                f"{notification.event_type} of {subject(notification)} "
                f"(message {notification.message_id})"
            )
            return error.replace(named, told, 1)
    if not notifications:
        return error
    first = notifications[0]
    rest = f" and the {len(notifications) - 1} after it" if len(notifications) > 1 else ""
    return (
        f"{first.event_type} of {subject(first)} (message {first.message_id}){rest} "
        f"not delivered: {error}"
    )


def said(exc: BaseException) -> str:
    """One line of a cell's failure: a named error's message, or the driver's own line
    (without SQLAlchemy's statement and link)."""
    if isinstance(exc, CellsError):
        return exc.message
    return first_line(getattr(exc, "orig", None) or exc)[:300]


@dataclass
class RelayReport:
    published: int = 0
    left: int | None = 0  # None: not counted (the cell could not be reached)
    busy: bool = False  # another relay holds the lease
    more: bool = False  # stopped at its time budget: rows may be waiting still
    error: str | None = None
    seconds: float = 0.0
    batches: list[int] = field(default_factory=list)
    # Published, then not deleted (a full disk, a lost connection): the next pass
    # publishes them again, so the periodic relay backs off this cell.
    unremoved: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "published": self.published,
            "left": self.left,
            "busy": self.busy,
            "error": self.error,
            "seconds": round(self.seconds, 3),
        }


class Outbox:
    """Publishes a cell's outbox in order under the cell's relay lease."""

    def __init__(
        self,
        publisher: Publisher,
        *,
        lease_seconds: float = 30.0,
        batch: int = 100,
        holder: str | None = None,
        clock: Callable[[], datetime] = utcnow,
        wait_for_lease: float = 2.0,
        deliver_budget: float | None = None,
    ) -> None:
        self.publisher = publisher
        self.lease = timedelta(seconds=lease_seconds)
        self.batch = batch
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuidlib.uuid4().hex[:8]}"
        self.clock = clock
        self.wait_for_lease = wait_for_lease
        # Set by an interrupted caller: a relay under way stops after its batch, its
        # lease given back (an interrupt probe: Ctrl-C went on relaying the backlog).
        self.stop = threading.Event()
        # Seconds ``deliver`` publishes for at most (then finishes its batch): a request
        # after a bus outage must not publish the whole backlog before it answers. What
        # it leaves goes with the next delivery or the periodic relay, in order.
        self.deliver_budget = deliver_budget

    add = staticmethod(add)

    def deliver(self, engine: sa.Engine) -> RelayReport:
        """After a commit: publish what waits in the cell's outbox, never raising for a
        bus failure (the rows stay for the relay; the report says why)."""
        deadline = time.monotonic() + self.wait_for_lease
        while True:
            try:
                report = self.relay(engine, budget=self.deliver_budget)
            except (CellsError, sa.exc.SQLAlchemyError) as exc:
                # The change is committed either way: never fail the operation now.
                report = RelayReport(error=f"{type(exc).__name__}: {exc}", left=None)
            if not report.busy or time.monotonic() >= deadline:
                break
            time.sleep(0.05)  # another producer is draining this cell: ours go with it
        if report.error:
            log.warning("outbox: notifications kept for the relay: %s", report.error)
        elif report.more:
            log.info("outbox: %d published; the rest is left for the relay", report.published)
        return report

    def relay(self, engine: sa.Engine, *, budget: float | None = None) -> RelayReport:
        """Publish every waiting row of one cell in id order, deleting each batch once
        the bus confirmed it; with ``budget``, stop after the batch that reaches that
        many seconds (``more``). Returns at once (``busy``) if another relay holds the
        lease."""
        started = time.perf_counter()
        report = RelayReport()
        if not self._acquire(engine):
            report.busy = True
            return report
        released = False
        try:
            while True:
                if self.stop.is_set():
                    report.more = True
                    break
                rows = self._next_batch(engine)
                if not rows:
                    break
                try:
                    notifications = [decode(row.body) for row in rows]
                except NotificationError as exc:
                    # Written by this code, so only a stricter decoder gets here: the row
                    # stays (the cell's outbox is stuck until an operator looks at it).
                    report.error = f"an outbox row of batch {rows[0].id}.. cannot be read: {exc}"
                    break
                try:
                    self.publisher.publish_many(notifications)
                except PublishError as exc:
                    report.error = undelivered(str(exc), notifications)
                    break
                last = len(rows) < self.batch
                try:
                    with write_transaction(engine) as conn:
                        conn.execute(outbox.delete().where(outbox.c.id.in_([r.id for r in rows])))
                        # One transaction for the delete and the lease: fewer commits per op.
                        kept = self._update_lease(conn, release=last)
                except (CellsError, sa.exc.SQLAlchemyError) as exc:
                    report.unremoved = len(rows)
                    report.error = (
                        f"{len(rows)} notifications published but not removed from the outbox "
                        f"(they go again with a later pass): {said(exc)}"
                    )
                    break
                report.published += len(rows)
                report.batches.append(len(rows))
                if last:
                    released = True
                    break
                if not kept:
                    report.error = "the relay lease was lost (taken over after expiry)"
                    break
                if budget is not None and time.perf_counter() - started >= budget:
                    report.more = True
                    break
        finally:
            if not released:
                self._release(engine)
            report.seconds = time.perf_counter() - started
        if report.error is not None:
            with connect(engine) as conn:
                report.left = pending(conn)
        return report

    def _next_batch(self, engine: sa.Engine) -> Sequence[Any]:
        with connect(engine) as conn:
            query = sa.select(outbox.c.id, outbox.c.body).order_by(outbox.c.id).limit(self.batch)
            return conn.execute(query).all()

    # Lease -----------------------------------------------------------------
    def _acquire(self, engine: sa.Engine) -> bool:
        try:
            return self._try_acquire(engine)
        except sa.exc.IntegrityError:
            return False  # another relay inserted the lease row first: it holds it

    def _try_acquire(self, engine: sa.Engine) -> bool:
        now = self.clock()
        with write_transaction(engine) as conn:
            row = conn.execute(
                sa.select(outbox_lease.c.holder, outbox_lease.c.expires_at)
                .where(outbox_lease.c.name == LEASE_NAME)
                .with_for_update()
            ).first()
            if row is None:
                conn.execute(
                    outbox_lease.insert().values(
                        name=LEASE_NAME, holder=self.holder, expires_at=now + self.lease
                    )
                )
                return True
            free = row.holder in (None, self.holder) or row.expires_at is None
            if not free and row.expires_at > now:
                return False
            self._set(conn, self.holder, now + self.lease)
            return True

    def _update_lease(self, conn: sa.Connection, *, release: bool) -> bool:
        """Renew (or release) our lease; False when another relay took it over."""
        values: dict[str, Any] = (
            {"holder": None, "expires_at": None}
            if release
            else {"expires_at": self.clock() + self.lease}
        )
        done = conn.execute(
            outbox_lease.update()
            .where(outbox_lease.c.name == LEASE_NAME, outbox_lease.c.holder == self.holder)
            .values(**values)
        )
        return done.rowcount == 1

    def _release(self, engine: sa.Engine) -> None:
        try:
            with write_transaction(engine) as conn:
                self._update_lease(conn, release=True)
        except (sa.exc.SQLAlchemyError, DatabaseUnavailable) as exc:
            # It expires by itself; the next relay waits at most one lease.
            log.warning("outbox: could not release the relay lease: %s", exc)

    @staticmethod
    def _set(conn: sa.Connection, holder: str, expires_at: datetime) -> None:
        conn.execute(
            outbox_lease.update()
            .where(outbox_lease.c.name == LEASE_NAME)
            .values(holder=holder, expires_at=expires_at)
        )
