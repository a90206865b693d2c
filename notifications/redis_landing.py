"""Taking a message off a Redis list without a moment where only the consumer holds it.

kombu's Redis channel takes a message with ``BRPOP`` and records it as unacknowledged
(its ``unacked`` hash) in a second command, after parsing it: a consumer killed between
the two, with the reply read or still in its socket, or a server that stopped between
them, lost the message, which was already off the list and not yet recorded.

Here a message moves, in one command the server runs atomically, from its list onto a
**landing** list of the consumer's own (``RPOPLPUSH``, and ``BRPOPLPUSH`` to wait), and
from there into kombu's record in one ``MULTI`` (the channel's QoS adds the landing's
removal to kombu's own transaction). At every moment it is on its list, on a landing,
or recorded. Each consumer lists its landings in a registry hash with the end of its
**lease** (the visibility timeout from its last renewal, by the server's clock: no key
with a time to live, which a ``volatile-*`` eviction policy would take first); a landing
whose lease has ended belonged to a consumer that died, and the sweep, run where kombu
restores unacknowledged messages after the same timeout, puts what it holds back at the
head of the list it came from. A consumer that was only paused past its lease may then
get a message delivered twice, which at-least-once delivery allows.

The keys are Cellsight's own (``_cellsight.*``) beside kombu's; producers, and kombu's
record, restore and ack, are unchanged.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["Landed", "Landings"]

# KEYS: source, landing, source, landing, ...: the first list holding a message gives
# it up onto its landing. Returns {pair number, message} or nil.
TAKE = """
for i = 1, #KEYS, 2 do
  local item = redis.call('RPOPLPUSH', KEYS[i], KEYS[i + 1])
  if item then return {(i + 1) / 2, item} end
end
return false
"""

# Everything on a landing back at the head of its list, the oldest message first in line
# (takes push at the landing's left). Returns how many went back.
BACK = """
local function back(landing, source)
  local moved = 0
  while true do
    local item = redis.call('LPOP', landing)
    if not item then return moved end
    redis.call('RPUSH', source, item)
    moved = moved + 1
  end
end
"""

# KEYS: registry, then landing, source pairs; ARGV: the lease in seconds, and '1' to put
# back what is on the landings. Registers the landings with their lease's end (by the
# server's clock), and puts back: only between takes, when a landing holds nothing but a
# message whose take's reply was lost or whose settling failed. Returns how many went back.
HOLD = (
    BACK
    + """
local ends = tonumber(redis.call('TIME')[1]) + tonumber(ARGV[1])
local moved = 0
for i = 2, #KEYS, 2 do
  redis.call('HSET', KEYS[1], KEYS[i], cjson.encode({KEYS[i + 1], ends}))
  if ARGV[2] == '1' then moved = moved + back(KEYS[i], KEYS[i + 1]) end
end
return moved
"""
)

# KEYS: registry. Every landing whose lease has ended goes back to its list and leaves
# the registry. Returns how many messages moved.
SWEEP = (
    BACK
    + """
local now = tonumber(redis.call('TIME')[1])
local entries = redis.call('HGETALL', KEYS[1])
local moved = 0
for i = 1, #entries, 2 do
  local ok, route = pcall(cjson.decode, entries[i + 1])
  if not ok or type(route) ~= 'table' or type(route[1]) ~= 'string'
      or type(route[2]) ~= 'number' then
    redis.call('HDEL', KEYS[1], entries[i])
  elseif route[2] < now then
    moved = moved + back(entries[i], route[1])
    redis.call('HDEL', KEYS[1], entries[i])
  end
end
return moved
"""
)

# KEYS: registry, then landing, source pairs: a closing consumer's landings go back to
# their lists and leave the registry. Returns how many moved.
RELEASE = (
    BACK
    + """
local moved = 0
for i = 2, #KEYS, 2 do
  moved = moved + back(KEYS[i], KEYS[i + 1])
  redis.call('HDEL', KEYS[1], KEYS[i])
end
return moved
"""
)

# KEYS: landing, source; ARGV: the message. Back at the head of its list, if still landed.
RETURN = """
if redis.call('LREM', KEYS[1], -1, ARGV[1]) > 0 then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  return 1
end
return 0
"""


class Landed:
    """A message on its consumer's landing: where it is, where it came from, its bytes,
    and, once read, its delivery tag (what kombu records it under)."""

    __slots__ = ("item", "landing", "source", "tag")

    def __init__(self, landing: str, source: str, item: bytes) -> None:
        self.landing, self.source, self.item = landing, source, item
        self.tag: Any = None


class Landings:
    """One consumer channel's landings, lease and registry entries. Keys are given and
    returned with the connection's global key prefix applied (``prefix``): the commands
    used here are not among those kombu's client prefixes by itself.

    A take waits at most ``MAX_WAIT`` and the lease, renewed at a quarter of its life
    before a take when due, lasts at least four of them: it cannot run out while its
    consumer waits, and the sweep never unregisters a landing a take may still fill."""

    MAX_WAIT = 1.0

    def __init__(self, prefix: str, lease_seconds: float) -> None:
        self.prefix = prefix
        self.consumer = uuid.uuid4().hex
        self.registry = f"{prefix}_cellsight.landings"
        lease_seconds = max(lease_seconds, 4 * self.MAX_WAIT)
        self.lease = math.ceil(lease_seconds)  # seconds: the server's clock is read in them
        self._renew_every = lease_seconds / 4
        self._due = 0.0
        self._held: dict[str, str] = {}  # landing -> source
        # The sources whose landings are held: for consuming, and for gets (``get``).
        self._sources: dict[bool, set[str]] = {False: set(), True: set()}
        self._landings: dict[tuple[str, bool], str] = {}  # names built once

    def landing(self, source: str, get: bool = False) -> str:
        """The landing of ``source`` (a prefixed key): a get's is apart from a consuming
        take's, so that a get on a channel whose take is under way never shares one."""
        name = self._landings.get((source, get))
        if name is None:
            kind = "get." if get else ""
            name = f"{self.prefix}_cellsight.landing.{self.consumer}.{kind}{source}"
            if len(self._landings) < 4096:  # a consumer's lists: a handful
                self._landings[(source, get)] = name
        return name

    def due(self, sources: Iterable[str], get: bool = False) -> bool:
        """Whether :meth:`hold` has anything to do (no round trip otherwise)."""
        return time.monotonic() >= self._due or not self._sources[get].issuperset(sources)

    def hold(
        self, client: Any, sources: Iterable[str], *, get: bool = False, reclaim: bool = True
    ) -> int:
        """Renews the lease, registers the landings of ``sources`` (prefixed keys) with
        those already held, and with ``reclaim`` puts back what they hold (only with no
        take under way). Returns how many messages went back."""
        for source in sources:
            self._held.setdefault(self.landing(source, get), source)
            self._sources[get].add(source)
        pairs = [k for landing, source in self._held.items() for k in (landing, source)]
        moved: int = client.eval(
            HOLD, 1 + len(pairs), self.registry, *pairs, self.lease, 1 if reclaim else 0
        )
        if reclaim:  # else a leftover waits for the next hold that may put it back
            self._due = time.monotonic() + self._renew_every
        return moved

    def unsettled(self) -> None:
        """A message may be left on a landing (a take's reply lost, a settling failed):
        the next :meth:`hold`, before the next take, puts it back."""
        self._due = 0.0

    def take_args(self, sources: Sequence[str], get: bool = False) -> list[str]:
        return [k for source in sources for k in (source, self.landing(source, get))]

    def sweep(self, client: Any) -> int:
        """Puts back what the landings of consumers whose lease is gone hold."""
        moved: int = client.eval(SWEEP, 1, self.registry)
        return moved

    def put_back(self, client: Any, landed: Landed) -> bool:
        """``landed`` back at the head of its list, if it is still on its landing."""
        return bool(client.eval(RETURN, 2, landed.landing, landed.source, landed.item))

    def release(self, client: Any) -> int:
        """At close: every landing back to its list, the registry entries and the lease
        gone. Returns how many messages went back."""
        pairs = [k for landing, source in self._held.items() for k in (landing, source)]
        moved: int = client.eval(RELEASE, 1 + len(pairs), self.registry, *pairs)
        self._held.clear()
        for held in self._sources.values():
            held.clear()
        return moved
