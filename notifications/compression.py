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

__all__ = ["BOUNDED_CODECS", "bounded_decompress"]

# kombu's codecs, by the names its ``compression`` header may carry.
_DECOMPRESSORS: dict[str, Callable[[], Any]] = {
    **dict.fromkeys(("application/x-gzip", "gzip", "zlib"), zlib.decompressobj),
    **dict.fromkeys(("application/x-bz2", "bzip2", "bzip"), bz2.BZ2Decompressor),
    **dict.fromkeys(("application/x-lzma", "lzma", "xz"), lzma.LZMADecompressor),
}

BOUNDED_CODECS = frozenset(_DECOMPRESSORS)


def bounded_decompress(body: bytes, codec: str, limit: int) -> bytes:
    """``body`` decompressed as kombu would, but to at most ``limit`` + 1 bytes. A body
    past the limit comes back cut one byte past it, which the decoder refuses as too
    large; an unknown codec (``KeyError``) or a stream cut short raises, as kombu's does."""
    make = _DECOMPRESSORS[codec]
    stream = make()
    out: bytes = stream.decompress(body, limit + 1)
    # bz2 and lzma read streams written one after another, as their own functions do
    # (pbzip2 writes them); zlib, like ``zlib.decompress``, ignores what follows its end.
    while len(out) <= limit and stream.eof and make is not zlib.decompressobj:
        rest = stream.unused_data
        if not rest:
            return out
        stream = make()
        try:
            out += stream.decompress(rest, limit + 1 - len(out))
        except (OSError, lzma.LZMAError):
            return out  # not another stream: ignored, as bz2's and lzma's functions do
    if len(out) <= limit and not stream.eof:
        raise ValueError(f"{codec} stream ends early")
    return out
