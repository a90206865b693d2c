"""The maintenance lock: one sync, verify or purge of a resource type at a time.

The lock is a metadata document (``lock:<resource>``) taken and renewed with the
engine's compare-and-set (``swap_meta``: a ``BEGIN IMMEDIATE`` transaction on the
embedded engine, ``op_type=create`` / ``if_seq_no`` on Elasticsearch and OpenSearch),
so it works across processes and machines for every engine. It records its owner (host,
pid, process start time, purpose) and an expiry that a heartbeat thread pushes forward.

A lock is stale, and may be taken over, once its expiry has passed (the owner stopped
renewing it: killed, frozen, cut off) or at once when its owner ran on this host and that
process is gone (a killed sync need not wait out the expiry). An owner whose renewal
finds someone else's lock has lost it: ``check()`` then raises ``LockLost`` so the
sync stops before touching aliases. A renewal that cannot reach the engine is retried;
it is not a loss (an owner cut off from the engine cannot write to it either).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid as uuidlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, TypeGuard

from cellsight.indexer.engines.base import EngineError, EngineUnavailable, SearchEngine

log = logging.getLogger(__name__)

TTL = 60.0  # seconds without a heartbeat after which a lock is stale
HEARTBEAT = 10.0
# How long the engine's word that the lock is ours stands: far below any expiry, and a
# process paused for longer asks again when it resumes (the monotonic clock runs on).
CONFIRMED_FOR = 1.0


class LockHeld(Exception):
    """Another sync, verify or purge of this resource type holds the lock; says whose."""


class LockLost(Exception):
    """This process's lock expired and was taken over; it must stop."""

    aliases = "as the one that took it over left them"  # a sync's failure says so


class LockRecordLost(LockLost):
    """The engine no longer holds the lock's record (restarted without its data): lost,
    but taken over by nobody."""

    aliases = "as the engine holds them"


def lock_key(resource: str) -> str:
    return f"lock:{resource}"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), against pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def _process_gone(value: dict[str, Any]) -> bool:
    if value.get("host") != socket.gethostname():
        return False
    pid = int(value.get("pid", 0))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    started = value.get("pid_started")
    return started is not None and _start_time(pid) not in (None, started)


def is_free(value: dict[str, Any] | None, now: datetime) -> bool:
    if value is None or value.get("released"):
        return True
    expires = datetime.fromisoformat(str(value.get("expires_at")))
    # An abandoned lock (``MaintenanceLock.abandon``) outlives its process: the write it
    # gave up on may land after that process is gone.
    return expires <= now or (not value.get("abandoned") and _process_gone(value))


def describe(value: dict[str, Any] | None) -> str:
    if not value:
        return "nobody"
    if value.get("released"):  # the holder that took it over has finished since
        who = f"{value.get('purpose', 'sync')} by {value.get('host')}:{value.get('pid')}"
        return f"a {who}, which released it at {value.get('at')}"
    left = ", left to expire over a write that may still land" if value.get("abandoned") else ""
    return (
        f"a {value.get('purpose', 'sync')} by {value.get('host')}:{value.get('pid')} "
        f"since {value.get('acquired_at')} (last heartbeat {value.get('heartbeat_at')}, "
        f"stale after {value.get('expires_at')}{left})"
    )


class MaintenanceLock:
    def __init__(
        self,
        engine: SearchEngine,
        resource: str,
        purpose: str,
        *,
        ttl: float = TTL,
        heartbeat: float = HEARTBEAT,
    ) -> None:
        self.engine = engine
        self.resource = resource
        self.purpose = purpose
        self.ttl = ttl
        self.heartbeat = heartbeat
        self.key = lock_key(resource)
        self.owner = str(uuidlib.uuid4())
        self._value: dict[str, Any] | None = None
        self._guard = threading.Lock()  # renewals and release never interleave
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._abandoned = False
        self._confirmed = -CONFIRMED_FOR  # when the engine last said the lock is ours
        self._thread: threading.Thread | None = None

    def _stamp(self, now: datetime) -> dict[str, Any]:
        acquired = self._value["acquired_at"] if self._value else now.isoformat()
        return {
            "owner": self.owner,
            "purpose": self.purpose,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pid_started": _start_time(os.getpid()),
            "acquired_at": acquired,
            "heartbeat_at": now.isoformat(),
            "expires_at": (now + timedelta(seconds=self.ttl)).isoformat(),
        }

    def _read(self) -> dict[str, Any] | None:
        # Retried: processes racing to create the engine's metadata store at its very
        # first use can see it half made for a moment.
        for attempt in range(5):
            try:
                return self.engine.get_meta(self.key)
            except EngineUnavailable:
                raise  # retried by ``acquire``, with its backoff
            except EngineError:
                if attempt == 4:
                    raise
                time.sleep(0.1 * (attempt + 1))
        return None

    def acquire(self) -> None:
        """Take the lock, or ``LockHeld``. A busy or unreachable engine is retried as a
        sync's writes are (a probe: one 5 s timeout on taking it failed a whole sync
        beside a busy indexer)."""
        from cellsight.indexer.retries import retrying

        retrying(self._acquire, f"taking the {self.resource} maintenance lock")
        self._thread = threading.Thread(target=self._beat, name=f"lock-{self.key}", daemon=True)
        self._thread.start()

    def _acquire(self) -> None:
        current = self._read()
        if self._is_mine(current):  # a take whose answer was lost
            self._adopt(current)
            return
        now = datetime.now(UTC)
        if not is_free(current, now):
            raise LockHeld(
                f"another {self.resource} sync, verify or purge is running: {describe(current)}"
            )
        mine = self._stamp(now)
        if not self.engine.swap_meta(self.key, current, mine):
            theirs = self._read()
            if self._is_mine(theirs):
                # A lost take applied late, after this attempt's read (a review).
                self._adopt(theirs)
                return
            raise self._just_started(theirs)
        self._value = mine  # first: an interrupt from here on releases what was taken
        if current and not current.get("released"):
            # Its process gone, a lock is taken before its expiry: "stale after" a time
            # still to come read as not stale (a sync probe).
            expired = datetime.fromisoformat(str(current.get("expires_at"))) <= now
            why = "" if expired else "; its process is gone"
            log.warning("took over a stale %s lock: %s%s", self.resource, describe(current), why)

    def _adopt(self, value: dict[str, Any]) -> None:
        """Take ``value``, this owner's stored lock, as ours, stamped anew: after the
        retries' backoff it may be close to its expiry (a review)."""
        self._value = value
        renewed = self._stamp(datetime.now(UTC))
        if not self._swap_own(renewed):  # expired meanwhile, and taken over
            self._value = None
            raise self._just_started(self._read())
        self._value = renewed

    def _just_started(self, theirs: dict[str, Any] | None) -> LockHeld:
        return LockHeld(
            f"another {self.resource} sync, verify or purge just started: {describe(theirs)}"
        )

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            with self._guard:
                if self._stop.is_set() or self._renew() is False:
                    return

    def _renew(self) -> bool | None:
        """One renewal (the caller holds ``_guard``): True when renewed, False when the
        lock is someone else's now (then it is lost), None when the engine could not say
        or the lock is abandoned (held, not renewed, until it expires)."""
        if self._value is None or self._lost.is_set():
            return False
        if self._abandoned:
            return None
        renewed = self._stamp(datetime.now(UTC))
        try:
            ok = self._swap_own(renewed)
        except EngineError as exc:
            # Busy or unreachable: keep trying. Only finding another owner's lock means
            # it is lost. (The embedded engine is busy while this sync's own index build
            # holds SQLite's write lock, which also keeps any other process from taking
            # the lock over meanwhile.)
            log.info("could not renew the %s lock yet: %s", self.resource, exc)
            return None
        if not ok:
            self._lost.set()
            return False
        self._value = renewed
        self._confirmed = time.monotonic()  # a renewal is the engine's word too
        return True

    def _swap_own(self, new: dict[str, Any]) -> bool:
        """Replace this process's lock with ``new``: False when it is someone else's.
        A write whose answer was lost (a renewal timed out on the way back) may have
        been applied, so the stored value can be this owner's without being the one
        last known: it is still ours (no one else writes this owner), and is replaced
        as it stands. Comparing with the last known value alone found "someone else's"
        lock there, and a sync gave up its work to itself."""
        if self.engine.swap_meta(self.key, self._value, new):
            return True
        current = self.engine.get_meta(self.key)
        return self._is_mine(current) and self.engine.swap_meta(self.key, current, new)

    def _is_mine(self, value: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
        """A stored lock this owner holds (not released, not another owner's)."""
        return value is not None and value.get("owner") == self.owner and not value.get("released")

    def holds(self, *, fresh: bool = False) -> bool:
        """Whether this process still holds the lock, asked of the engine: a process
        paused past the expiry resumes before its heartbeat notices. Ours and close to
        its expiry, it is renewed first (no one may take it over before the expiry).
        ``fresh``: asked now, whatever the engine said a moment ago (before a step that
        changes what serves)."""
        with self._guard:
            if self._lost.is_set() or self._value is None:
                return False
            if not fresh and time.monotonic() - self._confirmed < CONFIRMED_FOR:
                return True  # a sync checks between batches: not a read each time
            try:
                current = self.engine.get_meta(self.key)
            except EngineError:
                current = self._value  # the engine cannot say: ours until it expires
            if not self._is_mine(current):
                self._lost.set()
                return False
            expires = datetime.fromisoformat(str(current["expires_at"]))
            if (expires - datetime.now(UTC)).total_seconds() > self.heartbeat:
                self._confirmed = time.monotonic()
                return True
            renewed = self._renew()
            return renewed is True or (renewed is None and datetime.now(UTC) < expires)

    def check(self, *, fresh: bool = False) -> None:
        """``LockLost`` once the lock is not this process's: before each step of a sync,
        verify or purge that writes (``fresh``: as ``holds``)."""
        if not self.holds(fresh=fresh):
            try:
                current = self.engine.get_meta(self.key)
                holder = describe(current)
            except EngineError as exc:
                current, holder = {}, f"the engine could not say ({exc})"
            if current is None:  # a probe: "taken over: nobody" after osmem restarted empty
                raise LockRecordLost(
                    f"the {self.resource} lock was lost: the engine no longer holds its "
                    "record (restarted without its data, or its meta index deleted?)"
                )
            raise LockLost(
                f"the {self.resource} lock was lost (not renewed within {self.ttl:.0f}s and "
                f"taken over: {holder})"
            )

    def abandon(self) -> None:
        """Stop renewing, and let the release leave the record to expire (``ttl``): a
        run that gave up waiting for a write under way must not hand the lock to the
        next run while that write may still land."""
        with self._guard:
            self._abandoned = True
            self._stop.set()  # in the guard: a heartbeat under way renews no more
            if self._value is None or self._lost.is_set():
                return
            # Marked, and stamped once more: ``is_free`` then waits for the expiry even
            # once this process is gone (the CLI exits at once), and the expiry is a
            # whole ``ttl`` from now.
            abandoned = {**self._stamp(datetime.now(UTC)), "abandoned": True}
            try:
                if self._swap_own(abandoned):
                    self._value = abandoned
            except EngineError as exc:  # unmarked, it still expires on its own
                log.warning("could not mark the %s lock abandoned: %s", self.resource, exc)
        log.warning(
            "the %s lock is left to expire in %.0fs: a write may still be under way",
            self.resource,
            self.ttl,
        )

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat + 5)
        with self._guard:
            if self._abandoned:
                return
            if self._value is None and not self._lost.is_set():
                self._value = self._taken_unknowingly()
            if self._value is None or self._lost.is_set():
                return
            released = {
                "released": True,
                "owner": self.owner,
                "purpose": self.purpose,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "at": datetime.now(UTC).isoformat(),
            }
            try:
                self._swap_own(released)
            except EngineError as exc:  # it goes stale on its own
                log.warning("could not release the %s lock: %s", self.resource, exc)
            self._value = None

    def _taken_unknowingly(self) -> dict[str, Any] | None:
        """The stored lock, when a take that failed as far as this process knows (its
        answer lost, the retries spent) was applied after all: released too."""
        try:
            current = self.engine.get_meta(self.key)
        except EngineError:
            return None  # it expires by itself
        return current if self._is_mine(current) else None

    def __enter__(self) -> MaintenanceLock:
        try:
            self.acquire()
        except BaseException:
            # An interrupt after the take (its heartbeat starting, say) would leave the
            # lock held until its expiry: ``__exit__`` is not called for this.
            self.release()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
