"""The constrained value types the settings are made of."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

# The longest duration a setting may hold. Threading waits overflow past ~9.2e9 s
# (time_t) and inf or nan is no duration at all: such a value killed a background thread
# or made every request a 500, long after the settings were built. No timeout, lease,
# interval or cache age here needs more than a week.
MAX_SECONDS = 7 * 24 * 3600
Seconds = Annotated[float, Field(allow_inf_nan=False, le=MAX_SECONDS)]
# AMQP's basic.qos prefetch_count is a 16-bit field.
MAX_PREFETCH = 65_535
AMQP_NAME_BYTES = 255  # an exchange or queue name is an AMQP shortstr


def _amqp_name(value: str) -> str:
    """1 to 255 bytes of UTF-8, as the broker takes them. A bound in characters let 200
    "é"s (400 bytes) through, and the broker refused the name at the first declare.
    Empty: the broker would name the queue itself, durable and bound, collecting what
    nothing consumes."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:  # bytes that were not UTF-8 in the environment
        raise PydanticCustomError("amqp_name_utf8", "is not valid UTF-8") from None
    if not size:
        raise PydanticCustomError(
            "amqp_name_empty", "must not be empty (the broker would name the queue itself)"
        )
    if size > AMQP_NAME_BYTES:
        raise PydanticCustomError(
            "amqp_name_length",
            "is {size} bytes of UTF-8; an AMQP name holds at most {limit}",
            {"size": size, "limit": AMQP_NAME_BYTES},
        )
    return value


AmqpName = Annotated[str, AfterValidator(_amqp_name)]
