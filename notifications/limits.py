"""Bounds of every value the contract accepts, enforced at decode.

Nova's own database columns are the guide: names, hosts, ids and states are
``String(255)``; descriptions, fault text and public keys are ``Text`` (64 KiB);
metadata keys and values are 255 characters. Integers must fit the engines' signed
64-bit ``long``; times must stay within years 1..9999 once normalised to UTC. The
payload models (:mod:`cellsight.notifications.payloads`,
:mod:`cellsight.notifications.objects`) stay the one source of truth for the fields;
this module only says how large each may be, and both decoders (the pydantic
reference and the compiled fast path) and the JSON Schema export read it from here.
"""

from __future__ import annotations

from typing import Final

LONG_MIN: Final = -(2**63)
LONG_MAX: Final = 2**63 - 1

MAX_BODY_BYTES: Final = 4 * 1024 * 1024
"""A message body larger than this is refused before parsing (Nova's largest payloads,
an instance with hundreds of block devices, are well under 1 MiB)."""

PARSER_MAX_DEPTH: Final = 1024
"""JSON nesting deeper than this is refused by the parser (orjson's own, fixed limit)
as malformed, never a ``RecursionError``; a real notification is under 10 levels."""

NAME_LENGTH: Final = 255
"""Default cap of a string field (Nova's ``String(255)`` columns)."""

TEXT_LENGTH: Final = 65535
"""Cap of the ``Text`` fields below, and of any string the contract keeps verbatim."""

TEXT_FIELDS: Final = frozenset(
    {
        "display_description",
        "locked_reason",
        "public_key",
        "traceback",
        "exception",
        "exception_message",
        "allocation_request",
        "description",
        "export_location",
        "old_display_name",
    }
)

MAX_ITEMS: Final = 1000
"""Cap of a list or dict field (ip addresses, block devices, metadata, extra specs)."""

TAG_LENGTH: Final = 60
"""Cap of a server tag, which Nova's tag API allows of 1 to 60 characters without ','
or '/' (``cellsight.notifications.forms``); Tempest's server schemas hold the same."""

MAX_TAGS: Final = 50
"""Cap of a server's tags (Nova's ``MAX_TAG_COUNT``, Tempest's ``maxItems``)."""

ENVELOPE_LENGTH: Final = 255
"""Cap of ``event_type``, ``publisher_id``, ``message_id`` and the object name/version."""


def string_cap(field: str) -> int:
    return TEXT_LENGTH if field in TEXT_FIELDS else NAME_LENGTH
