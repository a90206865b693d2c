"""Values only Nova's own objects could have built: IP and MAC addresses, server tags.

Nova's ``IpPayload.address`` is an ``IPV4AndV6AddressField`` (Nova cannot build one
that is no address), its ``mac`` a ``MACAddressField``, and its ``version`` comes from
the network model, which derives it from the address; a server tag is what Nova's tag
API allows, 1 to 60 characters without ',' or '/', at most 50 a server. No Nova
notification carries another value, and Tempest's server schemas refuse a body that
shows one, so the contract refuses it.

Each rule is one function here, which both decoders call: the reference through the
annotated types below (pydantic), the compiled path in
:mod:`cellsight.notifications.fastcheck` (after msgspec's pass, which checks a tag's
length and the count of tags in C). The row fast path of a sync
(:mod:`cellsight.indexer.row_values`) calls them too.

An address is what ``ipaddress.ip_address`` reads, less an IPv6 address with a scope
(``fe80::1%eth0``): Tempest's ``ipv6`` format refuses a scope, as netaddr, which Nova's
field uses, does. It is decided by ``socket.inet_pton`` (C, 0.2 µs, where
``ip_address`` takes 3.5 µs for an IPv4 address and 6 µs for an IPv6 one: two
addresses a notification would be a third of its decode budget); a test holds the two
equal (leading zeros, whitespace, non-ASCII digits, embedded IPv4, scopes, ...). Its
version is 6 exactly when it holds a ':' (no IPv4 text does, every IPv6 text does).
"""

from __future__ import annotations

import re
from socket import AF_INET, AF_INET6, inet_pton
from typing import Annotated

from pydantic import AfterValidator, ValidationInfo, WithJsonSchema
from pydantic_core import PydanticCustomError

from cellsight.notifications import limits
from cellsight.notifications.errors import brief

AS_STORED = "as_stored"
"""The validation context under which a cell's row is read (``cells.rows``): a row
written by other means than Cellsight's or Nova's operations is indexed by a sync as its
cell holds it, past these rules, as past the contract's bounds (README, Limits); its
notifications are dead-lettered by the indexer."""


def _as_stored(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get(AS_STORED))


def ip_version(text: str) -> int | None:
    """4 or 6, the version of the IP address ``text``; None if it is no address."""
    if ":" in text:
        family, version = AF_INET6, 6
    else:
        family, version = AF_INET, 4
    try:
        inet_pton(family, text)
    except (OSError, ValueError):  # ValueError: a NUL, or a lone surrogate (no UTF-8)
        return None
    return version


def address_version(address: str) -> int:
    """The version of an address the contract accepted (what Nova's network model says)."""
    return 6 if ":" in address else 4


def _check_ip(value: str, info: ValidationInfo) -> str:
    if ip_version(value) is None and not _as_stored(info):
        raise ValueError(f"{brief(value, 60)} is not an IPv4 or IPv6 address")
    return value


# The exported JSON Schema says the same (``cellsight notifications schema``): the MAC,
# UUID and tag rules as patterns, which every validator applies; the address as the
# standard's ipv4/ipv6 formats, which a validator applies when asked to check formats.
IpStr = Annotated[
    str,
    AfterValidator(_check_ip),
    WithJsonSchema({"type": "string", "anyOf": [{"format": "ipv4"}, {"format": "ipv6"}]}),
]
"""An IP address (see the module docstring), kept as the producer wrote it."""


def is_mac(text: str) -> bool:
    """Six pairs of hex digits joined by ':' (either case): what oslo.versionedobjects'
    ``MACAddress`` field makes of any MAC it takes (lowered, '-' as ':'), and what
    Tempest's ``mac_address`` allows. Told without a pattern: the layout by slicing,
    the digits by ``bytes.fromhex``, which refuses any other character and skips
    whitespace (then fewer than six bytes)."""
    if len(text) != 17 or text[2::3] != ":::::":
        return False
    try:
        return len(bytes.fromhex(text.replace(":", ""))) == 6
    except ValueError:
        return False


def _check_mac(value: str, info: ValidationInfo) -> str:
    if not is_mac(value) and not _as_stored(info):
        raise ValueError(f"{brief(value, 60)} is not a MAC address (six hex pairs joined by ':')")
    return value


MAC_PATTERN = "^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$"
MacStr = Annotated[
    str,
    AfterValidator(_check_mac),
    # The lengths too: a pattern's "$" also matches before a final newline in Python's re.
    WithJsonSchema({"type": "string", "minLength": 17, "maxLength": 17, "pattern": MAC_PATTERN}),
]
"""A MAC address (``is_mac``), kept as the producer wrote it."""


TAG_FORBIDDEN = ",/"
"""The characters Nova's tag API refuses in a tag."""


def tag_problem(tag: str) -> str | None:
    """Why Nova's tag API would refuse ``tag``, or None."""
    if not 1 <= len(tag) <= limits.TAG_LENGTH:
        return f"tag {brief(tag)} has {len(tag)} characters, a tag has 1 to {limits.TAG_LENGTH}"
    held = [repr(c) for c in TAG_FORBIDDEN if c in tag]
    if held:
        return f"tag {brief(tag)} holds {' and '.join(held)}, which Nova's tag API refuses"
    return None


def _check_tags(tags: list[str], info: ValidationInfo) -> list[str]:
    if _as_stored(info):
        return tags
    if len(tags) > limits.MAX_TAGS:
        raise PydanticCustomError(
            "out_of_range",
            "{problem}",
            {"problem": f"{len(tags)} tags, the limit is {limits.MAX_TAGS}"},
        )
    for tag in tags:
        problem = tag_problem(tag)
        if problem is not None:
            kind = "malformed" if 1 <= len(tag) <= limits.TAG_LENGTH else "out_of_range"
            raise PydanticCustomError(kind, "{problem}", {"problem": problem})
    return tags


TagList = Annotated[
    list[str],
    AfterValidator(_check_tags),
    WithJsonSchema(
        {
            "type": "array",
            "maxItems": limits.MAX_TAGS,
            "items": {
                "type": "string",
                "minLength": 1,
                "maxLength": limits.TAG_LENGTH,
                "pattern": f"^[^{re.escape(TAG_FORBIDDEN)}]*$",
            },
        }
    ),
]
"""A server's tags, each as Nova's tag API allows it, at most ``limits.MAX_TAGS``."""
