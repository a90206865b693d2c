"""How a bus's channel hands on a message it could not read, and which connections
take the channel that does (the embedded bus and Redis URLs: ``redis_transport``).

Kept apart from the transport so that what reads these names (the indexer's pipeline,
``Bus.connection``) does not import redis-py and kombu's Redis transport in a process
on RabbitMQ: kombu imports the transport from its alias when a connection needs it.
"""

from __future__ import annotations

from kombu.transport import TRANSPORT_ALIASES

from cellsight.notifications.errors import MalformedNotification, TooLarge

__all__ = [
    "ALIAS",
    "UNREADABLE_CODES",
    "UNREADABLE_CODE_HEADER",
    "UNREADABLE_HEADER",
    "UNREADABLE_MARK",
    "kombu_url",
]

UNREADABLE_HEADER = "x-cellsight-unreadable"
"""On a message the channel could not read: why, in one line. Its body is the bytes the
message came as (kombu's envelope, or whatever else was on the list)."""
UNREADABLE_CODE_HEADER = "x-cellsight-unreadable-code"
"""Its reason code: ``too_large`` for a body that decompresses past the bound (as on
RabbitMQ), ``malformed`` otherwise."""
UNREADABLE_CODES = frozenset({MalformedNotification.reason, TooLarge.reason})
UNREADABLE_MARK = "cellsight-unreadable"
"""The envelope key, beside kombu's own, that holds ``[code, reason]`` on such a message:
what the indexer believes, where the two headers are for whoever reads the dead letter.
A producer sets any header it likes (an adversarial probe had a good notification
dead-lettered with a code and reason of its choosing); kombu's producers write no other
envelope key."""

ALIAS = "cellsight-redis"
TRANSPORT_ALIASES.setdefault(ALIAS, "cellsight.notifications.redis_transport:Transport")

# The schemes whose connections take that transport (kombu's Redis transport otherwise:
# ``rediss`` and ``sentinel`` keep kombu's, see the README's Limits).
_SCHEMES = {"redis": ALIAS, "redis+socket": f"{ALIAS}+socket"}


def kombu_url(url: str) -> str:
    """``url`` for a connection: on Cellsight's Redis transport where it is a Redis one."""
    scheme, sep, rest = url.partition("://")
    ours = _SCHEMES.get(scheme.lower()) if sep else None
    return f"{ours}://{rest}" if ours else url
