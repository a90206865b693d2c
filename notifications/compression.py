"""kombu's compression codecs, read with a bound: for every reader of the bus.

A few hundred bytes of bz2 can hold gigabytes of zeros, and kombu decompresses a body
whole (an adversarial probe's eight such messages took the indexer to 4.2 GB). Every
place that reads a compressed body (the indexer on RabbitMQ, the embedded bus's channel,
the dead-letter tools) goes through :func:`bounded_decompress`.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable
from typing import Any

__all__ = ["BOUNDED_CODECS", "MAX_STREAMS", "bounded_decompress"]

# kombu's codecs, by the names its ``compression`` header may carry.
_DECOMPRESSORS: dict[str, Callable[[], Any]] = {
    **dict.fromkeys(("application/x-gzip", "gzip", "zlib"), zlib.decompressobj),
    **dict.fromkeys(("application/x-bz2", "bzip2", "bzip"), bz2.BZ2Decompressor),
    **dict.fromkeys(("application/x-lzma", "lzma", "xz"), lzma.LZMADecompressor),
}

BOUNDED_CODECS = frozenset(_DECOMPRESSORS)


# Streams written one after another that a body may hold (pbzip2 writes one per 900 KB
# block: about five in the largest body the decoder takes). Each stream's end used to
# copy the rest of the body, so thousands of empty streams in 8 MB took the indexer 74 s
# (an adversarial probe); the body is now fed in chunks, and past this many streams it
# is not decompressed (it stays as it came, and the decoder refuses it).
MAX_STREAMS = 1000
_CHUNK = 64 << 10


def bounded_decompress(body: bytes, codec: str, limit: int) -> bytes:
    """``body`` decompressed as kombu would, but to at most ``limit`` + 1 bytes. A body
    past the limit comes back cut one byte past it, which the decoder refuses as too
    large; an unknown codec (``KeyError``), a stream cut short, or more than
    ``MAX_STREAMS`` streams raise (``ValueError``), as kombu's functions raise. Time
    linear in the body's length."""
    make = _DECOMPRESSORS[codec]
    # bz2 and lzma read streams written one after another, as their own functions do;
    # zlib, like ``zlib.decompress``, ignores what follows its end.
    many = make is not zlib.decompressobj
    view = memoryview(body)
    out = bytearray()
    stream, pos, streams = make(), 0, 1
    # The current stream's output joins ``out`` only once the stream ends: the standard
    # library's functions drop all of a later stream that fails, and it may span chunks.
    current = bytearray()
    while len(out) + len(current) <= limit:
        if stream.eof:
            out += current
            current.clear()
            pos -= len(stream.unused_data)  # where the stream ended
            if not many or pos >= len(view):
                break
            streams += 1
            if streams > MAX_STREAMS:
                raise ValueError(f"{codec}: more than {MAX_STREAMS} streams")
            stream = make()
        if pos >= len(view):
            raise ValueError(f"{codec} stream ends early")
        chunk = view[pos : pos + _CHUNK]
        pos += len(chunk)
        try:
            current += stream.decompress(chunk, limit + 1 - len(out) - len(current))
        except (OSError, lzma.LZMAError):
            if streams == 1:
                raise
            break  # not another stream: ignored, as bz2's and lzma's functions do
    else:
        out += current  # past the limit: cut one byte past it, whichever stream it is in
    return bytes(out)
