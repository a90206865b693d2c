"""Compressed bodies are read as the standard library's functions read them, within a
bound of output and in time linear in the input (``notifications.compression``).

The bound of output was there: a bomb comes back cut one byte past the limit. The time
was not: every stream's end copied the rest of the body, and an adversarial probe's
8 MB of empty bz2 streams held the indexer (and ``dlq list``) for over a minute.
"""

from __future__ import annotations

import bz2
import lzma
import random
import zlib
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellsight.notifications.compression import MAX_STREAMS, bounded_decompress

LIMIT = 1 << 20
CODECS: dict[str, tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]] = {
    "application/x-bz2": (bz2.compress, bz2.decompress),
    "application/x-lzma": (lzma.compress, lzma.decompress),
    "application/x-gzip": (zlib.compress, zlib.decompress),
}


def _reads_as(codec: str, body: bytes) -> tuple[str, object]:
    """What the standard library's function makes of ``body``: its bytes, or that it
    refused it (which error does not matter: kombu's message then keeps the body)."""
    try:
        return ("read", CODECS[codec][1](body))
    except (OSError, ValueError, EOFError, lzma.LZMAError, zlib.error):
        return ("refused", None)


def _ours(codec: str, body: bytes) -> tuple[str, object]:
    try:
        return ("read", bounded_decompress(body, codec, LIMIT))
    except (OSError, ValueError, EOFError, lzma.LZMAError, zlib.error):
        return ("refused", None)


@settings(max_examples=150, deadline=None)
@given(
    codec=st.sampled_from(sorted(CODECS)),
    parts=st.lists(st.binary(max_size=3000), min_size=1, max_size=4),
    tail=st.sampled_from(["", "garbage", "cut", "cut second"]),
)
def test_bodies_read_as_the_standard_library_reads_them(
    codec: str, parts: list[bytes], tail: str
) -> None:
    """Streams one after another, trailing bytes that are no stream, a stream cut
    short (the only one, or a later one): read alike, or refused alike."""
    compress = CODECS[codec][0]
    streams = [compress(p) for p in parts]
    if tail == "garbage":
        streams.append(b"not a stream")
    elif tail == "cut":
        streams[0] = streams[0][:-3]
    elif tail == "cut second" and len(streams) > 1:
        streams[1] = streams[1][: len(streams[1]) // 2]
    body = b"".join(streams)
    assert _ours(codec, body) == _reads_as(codec, body)


@pytest.mark.parametrize("codec", ["application/x-bz2", "application/x-lzma"])
@pytest.mark.parametrize("flip", [-4, -8, -40])
def test_a_later_stream_that_fails_past_the_first_chunk_is_dropped_whole(
    codec: str, flip: int
) -> None:
    """The body is read in chunks; a later stream whose fault comes after its first
    chunk gave its earlier chunks' output (1.8 MB where the standard library gives 8
    bytes: a review found it), so a notification followed by one read as garbage."""
    compress = CODECS[codec][0]
    noise = random.Random(flip).randbytes(600_000)  # within LIMIT, over many chunks
    broken = bytearray(compress(noise))
    broken[flip] ^= 0xFF
    body = compress(b'{"a": 1}') + bytes(broken)
    assert _ours(codec, body) == _reads_as(codec, body)


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_a_bomb_comes_back_cut_one_byte_past_the_limit(codec: str) -> None:
    bomb = CODECS[codec][0](b"0" * (LIMIT * 4))
    assert bounded_decompress(bomb, codec, LIMIT) == b"0" * (LIMIT + 1)


@pytest.mark.parametrize("codec", ["application/x-bz2", "application/x-lzma"])
def test_thousands_of_streams_are_refused_in_time_linear_in_the_body(codec: str) -> None:
    """The probe's body: 8 MB of empty streams (74 s in the indexer before). Up to
    ``MAX_STREAMS`` are read; past that the body is refused, not read in full."""
    empty = CODECS[codec][0](b"")
    many = empty * (8_000_000 // len(empty))
    with pytest.raises(ValueError, match=f"more than {MAX_STREAMS} streams"):
        bounded_decompress(many, codec, LIMIT)
    assert bounded_decompress(CODECS[codec][0](b"x") * MAX_STREAMS, codec, LIMIT) == (
        b"x" * MAX_STREAMS
    )
