"""The indexer's kombu consumer: batch, decode, write, dead-letter, then ack.

A message is acked only after its verdict (see ``writer``): nothing is acked before its
write succeeded or was classified. A batch flushes at a count, a byte size or an age,
whichever comes first, as one bulk request. While a batch is written (on a writer
thread, see ``inflight``, or in a writer process, see ``write_process``) the next ones
are received and decoded here; finished writes are settled in order. On SIGTERM/SIGINT
the caller sets ``stop``: what was received is written and acked within a bounded time,
then the channel closes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kombu import Connection, Consumer

from cellsight.indexer import metrics
from cellsight.indexer.amqp_deliveries import Received, UnwaitedSubscription, routed_deliveries
from cellsight.indexer.amqp_reads import FrameReader, bound_closing, buffered_frames
from cellsight.indexer.collector import BatchCollector
from cellsight.indexer.consumer_config import ConsumerConfig
from cellsight.indexer.deadletter import (
    REASON_CODE_HEADER,
    REASON_HEADER,
    DeadLetterer,
    DeadLetterUnconfirmed,
    heartbeats_meanwhile,
)
from cellsight.indexer.engines.base import SearchEngine
from cellsight.indexer.inflight import Flights, Pipeline, Settled
from cellsight.indexer.intake import Intake
from cellsight.indexer.write_process import WriteProcess, WriterFactory
from cellsight.indexer.writer import BatchWriter, CellLookup, Outcome, Verdict
from cellsight.notifications import queues
from cellsight.notifications.bus import cancelled, refused, turned_away

log = logging.getLogger(__name__)

__all__ = ["REASON_CODE_HEADER", "REASON_HEADER", "ConsumerConfig", "IndexerConsumer"]

SHUTDOWN_GRACE = 5.0  # seconds to finish writes after stop; the rest stays unacked
COLLECT_TIMEOUT = 2.0  # seconds a transport without a local close may take to close
BUSY_POLL = 0.005  # bus wait while writes are in flight, so their acks are not late
# Messages read from the buffer between two looks at the writes and the batch: the loop's
# own checks then cost a thirty-second per message, and a finished write waits for at
# most this many messages (about a millisecond) to be acked.
RECEIVE_BURST = 32
# Frames read per message wanted, at most: method, header, body. A burst stops at the
# messages it wants (an empty body has two frames) or at this many frames (a heartbeat
# is a frame, a body past the frame size several), whichever comes first.
FRAMES_PER_MESSAGE = 3
RECONNECT_FIRST = 0.5  # seconds before the first reconnect of an outage, doubling
RECONNECT_MAX = 30.0
STEADY = RECONNECT_MAX  # seconds consumed before a loss counts as a new outage (backoff anew)


class ChannelLost(Exception):
    """The broker closed the indexer's channel while it consumed. RabbitMQ does when a
    delivery stays unacknowledged past its ``consumer_timeout`` (30 minutes by default),
    as a batch does while its write retries through an engine outage. Like a lost
    connection: the channel's unacked messages are redelivered on a new one."""


class IndexerConsumer:
    def __init__(
        self,
        connection: Connection,
        engine: SearchEngine,
        config: ConsumerConfig,
        *,
        stop: threading.Event | None = None,
        cell_resolver: CellLookup | None = None,
        write_process: WriterFactory | None = None,
        collect_between_batches: bool = False,
        revive_bus: Callable[[], object] | None = None,
        pipeline: Pipeline | None = None,
    ) -> None:
        """With ``write_process`` (a factory of the engine and cell resolver, called in a
        child process) the engine's reads and writes run in that child; decoding stays
        here, and ``engine`` is then only asked its distribution. With
        ``collect_between_batches`` (for a process dedicated to the indexer, as the CLI's
        workers are) Python's cycle collector runs between batches while this consumer
        runs (``collector``). ``revive_bus`` is called before each reconnect after a lost
        connection, to bring the bus's server back if it died (``Bus.reviver``: the
        embedded bus's; a broker has none). ``pipeline`` stands in for the writes
        altogether: a benchmark's limit (``scripts/bench/bus_floor.py``)."""
        self.connection = connection
        self._revive_bus = revive_bus
        self.config = config
        self.stop = stop or threading.Event()
        # Retries end only when a shutdown's grace is over, not when ``stop`` is set.
        self._abort = threading.Event()
        self.writer = BatchWriter(
            engine, stop=self._abort, cell_resolver=cell_resolver, max_backoff=config.max_backoff
        )
        self.in_flight = config.in_flight_for(engine)
        self.exchange = queues.notifications_exchange(config.exchange)
        self.queue = queues.indexer_queue(config.queue, self.exchange)
        self.dlx = queues.dead_letter_exchange(config.dead_letter_exchange)
        self.dlq = queues.dead_letter_queue(config.dead_letter_queue, self.dlx)
        self.dead_letters = DeadLetterer(
            connection,
            exchange=config.exchange,
            dlx=self.dlx,
            dlq=self.dlq,
            stop=self.stop,
            max_backoff=config.max_backoff,
        )
        self._batch: list[Received] = []
        self._bytes = 0
        self._oldest = 0.0
        self._ready: Any = None  # the pipeline's prepared batch, not yet launched
        self._flights: Pipeline = (
            pipeline
            if pipeline is not None
            else Flights(self.writer, self.in_flight)
            if write_process is None
            else WriteProcess(write_process, self.in_flight, self.writer)
        )
        # Room for every batch the pipeline holds (a writer process one more than it
        # writes at once), one decoded and waiting, one being received.
        self.prefetch = config.prefetch_for(self._flights.limit)
        self._intake = Intake(config.held_bytes, self.prefetch)
        self._collector = BatchCollector() if collect_between_batches else None
        self.totals: dict[str, int] = {v.value: 0 for v in Verdict}
        self.acked = 0
        self.received = 0
        self._consuming_since: float | None = None  # monotonic, on the current connection
        self._ever_consumed = False  # an outage at start-up is "unreachable", not "lost"
        self._next_beat = 0.0  # when ``_beat`` next checks the bus's heartbeats

    # Run loop ---------------------------------------------------------------
    def run(self, max_batches: int | None = None) -> None:
        """Consume until ``stop`` is set (or ``max_batches`` launched, for tests)."""
        try:
            with self._collector or contextlib.nullcontext():
                self._run(max_batches)
        except DeadLetterUnconfirmed as exc:
            # Only raised once ``stop`` is set: the batch stays unacked for redelivery.
            log.warning("%s; its batch stays unacked", exc)
        finally:
            self.dead_letters.close()

    def _run(self, max_batches: int | None) -> None:
        backoff = RECONNECT_FIRST
        try:
            while not self.stop.is_set():
                self._consuming_since = None
                try:
                    self._consume(max_batches)
                    return
                except self.connection.connection_errors as exc:
                    if refused(exc, consumed=self._ever_consumed):
                        raise  # a configuration to fix: retrying would hide it
                    if self.stop.is_set():  # lost while stopping: no reconnect to announce
                        log.info("bus connection lost while stopping (%s): what was not "
                                 "acked is redelivered", exc)  # fmt: skip
                        if self.connection.transport.driver_type == "amqp":
                            self.connection.collect(socket_timeout=COLLECT_TIMEOUT)
                        return
                    backoff = self._backoff(backoff)
                    what = "bus connection lost" if self._ever_consumed else "bus unreachable"
                    detail = str(exc)
                    if turned_away(exc):
                        what = "bus unavailable"
                    elif cancelled(exc):  # its text says nothing: the queue's name does
                        what, detail = "the broker cancelled the consumer", self.queue.name
                    self._lost(f"{what} ({detail})", backoff)
                    self._revive()
                    self.connection = self.connection.clone()
                except ChannelLost as exc:
                    # The connection is sound: new channels on it.
                    backoff = self._backoff(backoff)
                    self._lost(f"bus channel closed by the broker ({exc.__cause__})", backoff)
                backoff = min(backoff * 2, RECONNECT_MAX)
        finally:
            self._flights.abort()
            self._flights.forget(grace=SHUTDOWN_GRACE)
            self._flights.close()

    def _backoff(self, grown: float) -> float:
        """The wait before reconnecting: ``grown`` within an outage, the first one again
        after a connection that consumed for ``STEADY`` seconds (else every outage after
        a few in the indexer's life would wait the longest backoff)."""
        since = self._consuming_since
        steady = since is not None and time.monotonic() - since >= STEADY
        return RECONNECT_FIRST if steady else grown

    def _lost(self, what: str, backoff: float) -> None:
        """Unacked messages of the lost channel are redelivered by the broker; writes in
        flight finish first so they cannot race their redelivery."""
        self._batch.clear()
        self._bytes = 0
        self._intake.reset()
        self._ready = None
        self._flights.forget(grace=self.config.max_backoff)
        log.warning("%s; reconnecting in %.1fs", what, backoff)
        if self._collector is not None:  # no batch settles while the bus is down
            self._collector.idle()
        self.stop.wait(backoff)

    def _revive(self) -> None:
        """After the backoff (so a stopping indexer starts no server), ask the bus to
        bring its server back: nothing else restarts the embedded one."""
        if self._revive_bus is None or self.stop.is_set():
            return
        try:
            self._revive_bus()
        except Exception as exc:
            # The bus is still down: the reconnect fails and the next one asks again.
            log.warning("bus server not brought back: %s", exc)

    def _consume(self, max_batches: int | None) -> None:
        launched = 0
        with self.connection.channel() as channel, self.connection.channel() as dl_channel:
            self.queue(channel).declare()
            self.dlq(dl_channel).declare()
            channel.basic_qos(0, self.prefetch, False)
            consumer = Consumer(
                channel,
                queues=[self.queue],
                on_message=self._on_message,
                on_decode_error=self._on_undecodable,
                no_ack=False,
                prefetch_count=self.prefetch,
            )
            routed = routed_deliveries(self.connection, channel, self._on_message)
            with consumer, routed as router:
                steered = consumer if router is None else UnwaitedSubscription(consumer)
                self._consuming_since = time.monotonic()
                self._ever_consumed = True
                frames = buffered_frames(self.connection)
                try:
                    while not self.stop.is_set():
                        self._receive(frames)
                        self._beat()
                        if self._flights.any_settled():
                            self._settle()
                        # After settling: a consumer resumed here has the next wait's
                        # deliveries (its cancelled one ended it only by timeout, 1 s).
                        self._intake.steer(steered)
                        if self._ready is None and self._due():
                            self._ready = self._plan()
                        if self._ready is not None and self._flights.can_take(self._ready):
                            self._flights.launch(self._ready)
                            self._ready = None
                            launched += 1
                            if max_batches is not None and launched >= max_batches:
                                break
                    self._finish(SHUTDOWN_GRACE if self.stop.is_set() else None)
                    if self.stop.is_set():
                        bound_closing(self.connection, COLLECT_TIMEOUT)
                except self.connection.channel_errors as exc:
                    # Only once consuming: a declaration the broker refuses (arguments
                    # that differ from the queue's) is a setting to fix, not retried.
                    raise ChannelLost from exc
                except self.connection.connection_errors:
                    # Found dead (missed heartbeats): let go of it without the channels'
                    # closing handshakes, which wait without end on a path kept open that
                    # carries nothing (a probe: the indexer hung, deaf to SIGTERM). AMQP
                    # only: Redis has none, and its collected channels failed kombu's exit.
                    if self.connection.transport.driver_type == "amqp":
                        self.connection.collect(socket_timeout=COLLECT_TIMEOUT)
                    raise

    def _receive(self, frames: FrameReader | None) -> None:
        """A burst of messages already buffered (at most ``RECEIVE_BURST``, and no more
        than the batch has room for), or one message or a timeout from the bus
        (``amqp_reads`` says why the difference matters)."""
        if frames is not None and frames.ready():
            wanted = max(1, min(RECEIVE_BURST, self.config.batch_count - len(self._batch)))
            target = self.received + wanted
            # Ended at the bound too: the cancel goes out before the burst's rest is handed
            # back (handed back while consuming, a message can come back at once).
            frames.read_frames(
                FRAMES_PER_MESSAGE * wanted, lambda: self.received >= target or self._intake.full
            )
            return
        received = self.received
        with contextlib.suppress(TimeoutError):
            self.connection.drain_events(timeout=self._wait_time())
        # Nothing came: a timeout, or only one of the broker's heartbeats (which end the
        # wait, and at ``?heartbeat=1`` or 2 come before its timeout).
        if self.received == received and self._collector is not None:
            self._collector.idle()

    def _beat(self) -> None:
        """AMQP heartbeats, when the bus URL asks for them (``?heartbeat=N``): kombu sends
        them only when asked; here about once a second while messages come, and at each
        of the broker's heartbeats while idle (``DeliveryRouter``). Without them the
        broker closed an idle indexer's connection every 2N s. A no-op on Redis."""
        now = time.monotonic()
        if now >= self._next_beat:
            self._next_beat = now + 1.0
            self.connection.heartbeat_check()
            self._flights.watch()

    def _wait_time(self) -> float:
        if self._flights or self._ready is not None:
            return BUSY_POLL
        if not self._batch:
            return 1.0
        return max(0.0, self._oldest + self.config.batch_age - time.monotonic())

    def _due(self) -> bool:
        if not self._batch:
            return False
        return (
            len(self._batch) >= self.config.batch_count
            or self._bytes >= self.config.batch_bytes
            or time.monotonic() - self._oldest >= self.config.batch_age
        )

    def _on_message(self, message: Received) -> None:
        if not self._intake.admit(message):
            message.requeue()
            return
        if not self._batch:
            self._oldest = time.monotonic()
        self._batch.append(message)
        self._bytes += len(message.body or b"")
        self.received += 1

    def _on_undecodable(self, message: Received, exc: Exception) -> None:
        """A message kombu could not prepare (a body its ``compression`` header says is
        compressed and is not): without this kombu raises out of the receive, and the
        indexer would stop on it, and again on its redelivery. Its body stays as it came
        and goes to the decoder like any other (a poison is dead-lettered)."""
        log.warning("message kombu could not prepare (%s: %s): read as it came",
                    type(exc).__name__, exc)  # fmt: skip
        self._on_message(message)

    def _plan(self) -> Any:
        batch, self._batch, self._bytes = self._batch, [], 0
        return self._flights.prepare(batch)

    # Settle -----------------------------------------------------------------
    def _finish(self, grace: float | None) -> None:
        """Write and settle what was received; with a ``grace`` (shutdown) only for that
        long: a write blocked by an outage is abandoned unacked, redelivered later."""
        pending = [b for b in (self._ready, self._plan() if self._batch else None) if b]
        self._ready = None
        deadline = time.monotonic() + grace if grace is not None else float("inf")
        while (pending or self._flights) and time.monotonic() < deadline:
            if pending and self._flights.can_take(pending[0]):
                self._flights.launch(pending.pop(0))
                continue
            self._flights.wait_oldest(min(0.05, deadline - time.monotonic()))
            self._settle()
        if pending or self._flights:
            self._flights.abort()
            left = sum(len(b.messages) for b in pending) + self._flights.forget(grace=1.0)
            log.warning("shutdown: %d messages stay unacked (write not finished)", left)

    def _settle(self) -> None:
        # A generator expression's frame ends with it, so no settled batch is still
        # referenced when the collector looks at what the batches left.
        settled = sum(self._settle_one(f, o) for f, o in self._flights.settled())
        if settled and self._collector is not None:
            self._collector.batch_done()

    def _settle_one(self, flight: Settled, outcomes: list[Outcome]) -> int:
        pairs = zip(flight.messages, outcomes, strict=True)
        if dead := [(m, o) for m, o in pairs if o.verdict is Verdict.DEAD]:
            with heartbeats_meanwhile(self.connection):  # one thread for the batch's letters
                for message, outcome in dead:
                    self._dead_letter(message, outcome)
        for outcome in outcomes:
            self.totals[outcome.verdict.value] += 1
        self._ack(flight.messages)
        self._intake.settled(flight.messages)
        self.acked += len(flight.messages)
        metrics.BATCH_SIZE.observe(len(flight.messages))
        metrics.BATCH_SECONDS.observe(time.perf_counter() - flight.started)
        log.debug("batch of %d settled", len(flight.messages))
        return 1

    def _ack(self, batch: list[Received]) -> None:
        """On AMQP one ``basic.ack`` with ``multiple`` acks the whole batch: it holds every
        message delivered on this channel since the previous flush (a reconnect starts a
        new channel and an empty batch), so nothing outside it is covered. Measured: an
        ack frame and socket write per message cost 6-11 us of CPU each, one per batch
        ~0.2 us per message. Kombu's Redis transport acks only the tag given: one by one."""
        if self.connection.transport.driver_type == "amqp":
            last = max(batch, key=lambda m: m.delivery_tag)
            last.channel.basic_ack(last.delivery_tag, multiple=True)
            return
        for message in batch:
            message.ack()

    def _dead_letter(self, message: Received, outcome: Outcome) -> None:
        """Returns once the DLQ holds the message (confirmed), before the batch is acked."""
        reason_code, event_type = outcome.reason_code or "unknown", outcome.event_type or ""
        self.dead_letters.send(message, reason_code, outcome.reason or "", event_type)
