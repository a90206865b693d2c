"""The compiled decoder on what wraps a notification and on its times: it accepts only
what the reference decoder accepts, with the same document.

The oslo wrapper in any form (its keys given any way, other keys beside them, a key
given twice) and a body of any buffer type (a memoryview measured by its bytes); the
envelope's and the payload's times, near their layouts or not."""

from __future__ import annotations

import json
from datetime import UTC
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cellsight.indexer.planning import Planned, plan, plan_fast
from cellsight.notifications import envelope, fastcheck, limits
from cellsight.notifications.errors import NotificationError
from tests.support import novagen
from tests.support.decoding import dead_reason_code, reference_plan, same_plan, same_verdict

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(
    version=st.sampled_from(['"2.0"', '"2"', "2.0", "null", '"2.0 "', None]),
    message=st.sampled_from(["text", "object", "null", "nested", "number", "invalid", None]),
    extra=st.dictionaries(
        st.sampled_from(["event_type", "payload", "priority", "x", "oslo.versions"]),
        _json_values,
        max_size=3,
    ),
    duplicate=st.booleans(),
    kind=st.sampled_from([bytes, bytearray, memoryview, str]),
)
def test_the_oslo_wrapper_decides_as_the_reference_does(
    version: str | None,
    message: str | None,
    extra: dict[str, Any],
    duplicate: bool,
    kind: type,
) -> None:
    """Whatever wraps the notification (the oslo keys in any form, other keys beside
    them, a key given twice, a body of any buffer type), the compiled path accepts only
    what the reference accepts, with the same document, and the planner's verdict is
    the reference's."""
    inner = novagen.body(novagen.notification("instance.update", seed=2), wrapped=False)
    messages = {
        "text": json.dumps(inner.decode()),
        "object": inner.decode(),
        "null": "null",
        "nested": json.dumps(novagen.body(novagen.notification(seed=4)).decode()),
        "number": "1e400",
        "invalid": json.dumps(inner.decode())[:-20] + '\\ud800"',
    }
    parts = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in extra.items()]
    if version is not None:
        parts.append(f'"oslo.version": {version}')
    if message is not None:
        if duplicate:
            parts.append('"oslo.message": "{}"')
        parts.append(f'"oslo.message": {messages[message]}')
    text = "{" + ", ".join(parts) + "}"
    raw = text if kind is str else kind(text.encode())
    fast, reference = plan_fast(0, raw), reference_plan(text.encode())
    if fast is not None:
        same_verdict(fast, reference)
    outcomes, planned = plan([raw])
    same_verdict(planned[0] if planned else outcomes[0], reference)


def test_a_memoryview_is_measured_and_read_as_the_reference_reads_it() -> None:
    """A body's size is its bytes, not a view's items, and a view that is not contiguous
    is refused by the reference's parser: the compiled path declines both (a review
    found them planned)."""
    wrapped = novagen.body(novagen.notification("instance.update", seed=3))
    padded = wrapped + b" " * (limits.MAX_BODY_BYTES - len(wrapped) + 8)
    padded += b" " * (-len(padded) % 4)
    view = memoryview(padded).cast("I")
    assert view.nbytes > limits.MAX_BODY_BYTES > len(view)
    assert (
        plan_fast(0, view) is None
        and dead_reason_code(reference_plan(view.tobytes())) == "too_large"
    )
    strided = memoryview(bytes(b for pair in zip(wrapped, wrapped, strict=True) for b in pair))[::2]
    assert strided.tobytes() == wrapped and not strided.contiguous
    assert plan_fast(0, strided) is None
    outcomes, planned = plan([strided])
    assert not planned and outcomes[0] is not None and outcomes[0].reason_code == "malformed"


# Times read by their layout --------------------------------------------------------
_LAYOUT_CHARS = st.sampled_from("0123456789TZ :.-+\u0663\uff11a")


def _mutated(text: str) -> st.SearchStrategy[str]:
    """``text`` with up to three characters replaced, one dropped or one added."""
    at = st.integers(0, len(text) - 1)
    replaced = st.lists(st.tuples(at, _LAYOUT_CHARS), max_size=3).map(
        lambda changes: "".join(dict(changes).get(i, c) for i, c in enumerate(text))
    )
    dropped = at.map(lambda i: text[:i] + text[i + 1 :])
    added = st.tuples(at, _LAYOUT_CHARS).map(lambda a: text[: a[0]] + a[1] + text[a[0] :])
    return st.one_of(st.just(text), replaced, dropped, added)


@settings(max_examples=300, deadline=None)
@given(
    text=st.sampled_from(
        ["2026-11-26 16:55:02.195661", "2026-11-26T16:55:02", "1999-01-01 00:00:00"]
    ).flatmap(_mutated)
)
def test_the_envelope_time_is_the_references(text: str) -> None:
    """oslo.messaging's naive form is read with an offset appended; every text, near
    that form or not, gets the reference's value or its error."""
    try:
        expected: Any = envelope._parse_timestamp(text)
    except NotificationError as exc:
        expected = type(exc)
    try:
        got: Any = fastcheck.envelope_time(text)
    except NotificationError as exc:
        got = type(exc)
    assert got == expected
    if isinstance(got, type):
        return
    assert got is None or got.tzinfo is UTC


@settings(max_examples=300, deadline=None)
@given(
    text=st.sampled_from(["2026-11-26T16:55:02.195661Z", "2026-11-26T16:55:02Z"]).flatmap(_mutated)
)
def test_a_payload_time_near_novas_layout_decides_as_the_reference_does(text: str) -> None:
    """Nova's two forms are told by their separators, every other by the pattern: what
    the compiled path accepts, the reference reads as the same time, and a time of the
    forms it reads that the reference accepts takes the compiled path."""
    body = novagen.notification(seed=2)
    body["payload"]["nova_object.data"]["updated_at"] = text
    raw = novagen.body(body)
    fast = plan_fast(0, raw)
    reference = reference_plan(raw)
    if isinstance(fast, Planned):
        same_plan(fast, reference)
    if fastcheck.time_ok(text) and isinstance(reference, Planned):
        assert isinstance(fast, Planned)
