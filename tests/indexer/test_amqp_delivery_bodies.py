"""A routed delivery's body, read as kombu reads it (``cellsight.indexer.amqp_deliveries``).

Frames are built with py-amqp's own serializers and routed: a body is decompressed by
its compression header as kombu's ``decompress`` does, within a bound (a bomb is
refused as too large without being held), then decoded by its content encoding only
with a linear text codec; a dead letter carries the bytes as they came. (The routing
itself, against py-amqp's own reading and through RabbitMQ: ``test_amqp_deliveries``.)"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from kombu.compression import compress, decompress

from cellsight.indexer.amqp_deliveries import (
    Delivery,
    DeliveryRouter,
    bounded_decompress,
    text_codec,
)
from cellsight.indexer.deadletter import wire_bytes
from cellsight.indexer.planning import plan
from cellsight.notifications.limits import MAX_BODY_BYTES
from tests.support.amqp_frames import FakeChannel, FakeConnection, Frame, deliver_frames


def routed(frames: list[Frame]) -> list[Delivery]:
    """The deliveries a router hands on for ``frames``."""
    got: list[Delivery] = []
    router = DeliveryRouter(FakeConnection(), FakeChannel(), got.append)
    for frame in frames:
        router(frame)
    return got


@pytest.mark.parametrize("codec", ["application/x-gzip", "application/x-bz2"])
def test_a_compressed_body_is_decompressed_as_kombu_does(codec: str) -> None:
    """oslo.messaging can compress (``kombu_compression``): the indexer reads the
    notification, and a dead letter would carry the bytes as they came."""
    body = b'{"event_type": "compute.instance.update"}' * 20
    packed, _ = compress(body, codec)
    props = {"application_headers": {"compression": codec}, "content_encoding": "binary"}
    got = routed(deliver_frames(1, packed, props, [100]))
    (delivery,) = got
    assert delivery.body == body
    assert delivery.wire_body == packed


@pytest.mark.parametrize("encoding", ["UTF-16", "latin-1"])
def test_a_compressed_body_is_then_decoded_by_its_encoding_as_kombu_does(encoding: str) -> None:
    """Found from outside: a body declared UTF-16 was read, and the same body compressed
    was dead-lettered as "not UTF-8" (decompressed, never decoded). kombu decompresses,
    then decodes by the content encoding."""
    text = '{"event_type": "compute.instance.update", "caf\u00e9": 1}'
    packed, _ = compress(text.encode(encoding), "application/x-gzip")
    props: dict[str, Any] = {"application_headers": {"compression": "application/x-gzip"}}
    props["content_encoding"] = encoding
    got = routed(deliver_frames(1, packed, props, [10]))
    (delivery,) = got
    assert delivery.body == text
    assert delivery.wire_body == packed


def test_a_body_that_does_not_decompress_is_not_decoded_either() -> None:
    """Its bytes stay as they came, not read as latin-1 text (a review found the
    decoding applied to the bytes that failed to decompress)."""
    props: dict[str, Any] = {"application_headers": {"compression": "application/x-gzip"}}
    props["content_encoding"] = "latin-1"
    got = routed(deliver_frames(1, b"not gzip \xe9", props, []))
    assert [d.body for d in got] == [b"not gzip \xe9"]


def test_a_body_that_does_not_decompress_stays_as_it_came() -> None:
    props = {"application_headers": {"compression": "application/x-gzip"}}
    got = routed(deliver_frames(1, b"not gzip", props, []))
    assert [d.body for d in got] == [b"not gzip"]


@pytest.mark.parametrize(
    ("encoding", "body", "read"),
    [
        ("latin-1", b"caf\xe9", "caf\u00e9"),  # decoded, as py-amqp does
        ("UTF-16", "{}".encode("utf-16"), "{}"),
        ("utf-8", b"caf\xc3\xa9", b"caf\xc3\xa9"),  # stays bytes, which decoders read
        # Python's punycode decoder takes time quadratic in its input: never used (an
        # adversarial probe's 480 KB body held the indexer 53 s); idna's is Python too.
        ("punycode", b"x" * 1000 + b"-" + b"ba" * 1000, b"x" * 1000 + b"-" + b"ba" * 1000),
        ("idna", b"xn--caf-dma", b"xn--caf-dma"),
        ("rot13", b"{}", b"{}"),  # no text encoding: a transform
        ("no-such-codec", b"{}", b"{}"),
        ("utf\x00-8", b"{}", b"{}"),  # codecs.lookup raises ValueError: it stopped the indexer
        # Past the decoder's bound it is refused as too large: not decoded first.
        ("latin-1", b"x" * (MAX_BODY_BYTES + 1), b"x" * (MAX_BODY_BYTES + 1)),
    ],
)
def test_a_body_is_decoded_only_with_a_linear_text_codec(
    encoding: str, body: bytes, read: bytes | str
) -> None:
    props = {"content_encoding": encoding}
    got = routed(deliver_frames(1, body, props, [len(body) // 2] if len(body) > 1 else []))
    (delivery,) = got
    assert delivery.body == read
    assert wire_bytes(delivery.body, encoding) == body  # its dead letter's bytes


def test_an_encoding_name_lookup_cannot_fail() -> None:
    """Names py-amqp can hand over that ``codecs.lookup`` raises on other than with
    ``LookupError`` (a lone surrogate, from its ``surrogatepass`` reading)."""
    assert text_codec("utf-8\udcff") is None
    assert text_codec("latin\x00-1") is None
    assert text_codec("LATIN-1") == "iso8859-1"


def test_dead_letters_carry_the_bytes_that_came() -> None:
    """A body py-amqp decoded from latin-1 is encoded back with latin-1, not UTF-8; a
    routed delivery's own bytes are used as they are."""
    assert wire_bytes("caf\u00e9", "latin-1") == b"caf\xe9"
    assert wire_bytes("", "binary") == b""
    assert wire_bytes(b"\xff", "utf-8") == b"\xff"


CODECS = ["application/x-gzip", "application/x-bz2", "application/x-lzma", "zlib", "bzip2", "xz"]


@settings(max_examples=80, deadline=None)
@given(body=st.binary(max_size=4000), codec=st.sampled_from(CODECS), cut=st.integers(1, 60))
def test_bounded_decompression_reads_as_kombu_does(body: bytes, codec: str, cut: int) -> None:
    """Within the limit, what kombu's ``decompress`` returns; a stream cut short raises
    where kombu's raises (the body then stays as it came)."""
    packed, _ = compress(body, codec)
    assert bounded_decompress(packed, codec, 10_000) == decompress(packed, codec)
    short = packed[: len(packed) - cut]
    assume(short)  # nothing at all: bz2's and lzma's own functions return b""
    with pytest.raises(Exception):  # noqa: B017  (each codec raises its own)
        decompress(short, codec)
    with pytest.raises(Exception):  # noqa: B017
        bounded_decompress(short, codec, 10_000)


@pytest.mark.parametrize("codec", ["application/x-gzip", "application/x-bz2", "application/x-lzma"])
def test_a_compression_bomb_is_refused_as_too_large_without_being_held(codec: str) -> None:
    """16 MiB of zeros in a few KB: decompressed only to one byte past the decoder's
    limit, which then refuses it as too large; its dead letter would carry the few KB."""
    packed, _ = compress(bytes(16 << 20), codec)
    assert len(packed) < 100_000
    props = {"application_headers": {"compression": codec}, "content_encoding": "binary"}
    got = routed(deliver_frames(1, packed, props, [len(packed)]))
    (delivery,) = got
    assert len(delivery.body) == MAX_BODY_BYTES + 1
    assert delivery.wire_body == packed
    outcomes, planned = plan([delivery.body])
    assert not planned and outcomes[0] is not None and outcomes[0].reason_code == "too_large"


def _outcome(read: Any) -> Any:
    try:
        return read()
    except Exception:
        return "raises"


@settings(max_examples=80, deadline=None)
@given(
    first=st.binary(max_size=300),
    second=st.binary(max_size=300),
    junk=st.binary(max_size=12),
    codec=st.sampled_from(CODECS),
)
def test_streams_one_after_another_read_as_kombu_reads_them(
    first: bytes, second: bytes, junk: bytes, codec: str
) -> None:
    """bz2 and lzma read concatenated streams (as pbzip2 writes them) and skip what is
    not one; zlib stops at its first. Whatever kombu returns or raises, so does this."""
    data = compress(first, codec)[0] + compress(second, codec)[0] + junk
    assert _outcome(lambda: bounded_decompress(data, codec, 10_000)) == _outcome(
        lambda: decompress(data, codec)
    )
