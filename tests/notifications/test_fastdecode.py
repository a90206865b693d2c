"""The compiled decoder is generated from the payload models: same fields, same
defaults, bounds from ``cellsight.notifications.limits``; realistic notifications take it."""

from __future__ import annotations

import json
import logging
from datetime import UTC
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellsight.indexer.outcomes import Outcome, Verdict
from cellsight.indexer.planning import Planned, plan, plan_fast
from cellsight.notifications import base, envelope, fastcheck, fastdecode, limits
from cellsight.notifications.errors import NotificationError
from cellsight.notifications.fastdecode import FAST_CLASSES, decode_fast
from cellsight.notifications.payloads import NOVA_INSTANCE_SUBCLASSES, InstancePayload
from tests.support import novagen
from tests.support.decoding import reference_plan


@pytest.mark.parametrize("model", FAST_CLASSES, ids=lambda m: m.__name__)
def test_structs_have_the_models_fields_and_defaults(model: type[base.VersionedObject]) -> None:
    struct = next(s for s, m in fastdecode._TOPS.items() if m is model)
    data = next(f.type for f in msgspec.structs.fields(struct) if f.name == "data")
    fields = {f.name: f for f in msgspec.structs.fields(data)}
    # Every field, in the order Nova sends the keys (found at msgspec's first look).
    assert list(fields) == list(model.wire_order())
    assert set(fields) == set(model.model_fields)
    for name, info in model.model_fields.items():
        f = fields[name]
        if info.is_required():
            assert f.required, name
        elif info.default_factory is not None:
            assert f.default_factory() == info.default_factory(), name  # type: ignore[call-arg]
        else:
            assert f.default == info.default, name


# Nova's field order (``nova/notifications/objects/instance.py``, each class's ``fields``),
# which oslo.versionedobjects' ``obj_to_primitive`` walks: a class's own, then its base's.
NOVA_INSTANCE = [
    "uuid",
    "user_id",
    "tenant_id",
    "reservation_id",
    "display_name",
    "display_description",
    "host_name",
    "host",
    "node",
    "os_type",
    "architecture",
    "availability_zone",
    "flavor",
    "image_uuid",
    "key_name",
    "kernel_id",
    "ramdisk_id",
    "created_at",
    "launched_at",
    "terminated_at",
    "deleted_at",
    "updated_at",
    "state",
    "power_state",
    "task_state",
    "progress",
    "ip_addresses",
    "block_devices",
    "metadata",
    "locked",
    "auto_disk_config",
    "request_id",
    "action_initiator_user",
    "action_initiator_project",
    "locked_reason",
    "shares",
]
NOVA_OWN = {
    "InstanceActionPayload": ["fault", "request_id"],
    "InstanceCreatePayload": ["keypairs", "tags", "trusted_image_certificates", "instance_name"],
    "InstanceUpdatePayload": ["state_update", "audit_period", "old_display_name", "tags"],
}


@pytest.mark.parametrize("model", FAST_CLASSES[:4], ids=lambda m: m.__name__)
def test_the_wire_order_is_novas(model: type[base.VersionedObject]) -> None:
    expected: list[str] = []
    for cls in reversed(model.__mro__):  # the base first: each class puts its own before
        own = NOVA_OWN.get(cls.__name__, NOVA_INSTANCE if cls is InstancePayload else [])
        expected = [*own, *(name for name in expected if name not in own)]
    order = list(model.wire_order())
    assert order[: len(expected)] == expected
    assert set(order[len(expected) :]) == {"revision", "cell_uuid", "forthcoming", "tags"} - set(
        expected
    )


def _key_orders(sent: Any, received: Any, path: str = "") -> list[tuple[str, list[str], list[str]]]:
    """The keys two wire values share, in each one's order, for every dict in them."""
    if isinstance(sent, list) and isinstance(received, list):
        pairs = zip(sent, received, strict=False)
        return [o for n, (a, b) in enumerate(pairs) for o in _key_orders(a, b, f"{path}[{n}]")]
    if not (isinstance(sent, dict) and isinstance(received, dict)):
        return []
    orders = [
        (
            path,
            [key for key in sent if key in received],
            [key for key in received if key in sent],
        )
    ]
    for key in sent.keys() & received.keys():
        orders += _key_orders(sent[key], received[key], f"{path}.{key}")
    return orders


@pytest.mark.parametrize("kind", sorted(novagen.EVENT_CLASSES))
def test_cellsight_sends_novas_order(kind: str) -> None:
    """What Cellsight's producer serialises puts every versioned object's keys, nested
    ones and those of classes read by shape included, in the order Nova sends them (the
    generated notification's, held to Nova's field lists above): its fast decode is the
    consumers' too."""
    nova = novagen.notification(kind, seed=5)["payload"]
    ours = envelope.decode(novagen.body(novagen.notification(kind, seed=5))).payload
    orders = _key_orders(nova, ours.to_primitive())
    assert len(orders) > 1
    for path, sent, received in orders:
        assert received == sent, path
    # A class read by shape (instance.exists' InstanceExistsPayload as an InstancePayload)
    # has fields the model does not know: the class's own, which oslo sends first.
    data = list(ours.to_primitive()[base.DATA])
    unknown = [key for key in data if key not in type(ours).model_fields]
    assert data[: len(unknown)] == unknown


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**16), order=st.randoms(use_true_random=False))
def test_the_key_order_changes_nothing(seed: int, order: Any) -> None:
    """Nova's order is the fast one; any other order decodes to the same document."""
    kinds = sorted(novagen.EVENT_CLASSES)
    notification = novagen.notification(kinds[seed % len(kinds)], seed=seed)
    data = notification["payload"]["nova_object.data"]
    keys = list(data)
    shuffled = dict(notification, payload=dict(notification["payload"]))
    order.shuffle(keys)
    shuffled["payload"]["nova_object.data"] = {k: data[k] for k in keys}
    one, other = (plan_fast(0, novagen.body(n)) for n in (notification, shuffled))
    assert isinstance(one, Planned) and isinstance(other, Planned)
    assert dict(one.op.document, indexed_at=None) == dict(other.op.document, indexed_at=None)


@pytest.mark.parametrize("name", sorted(novagen.sample_set()))
@pytest.mark.parametrize("wrapped", [True, False])
def test_realistic_notifications_take_the_compiled_path(name: str, wrapped: bool) -> None:
    body = novagen.body(novagen.sample_set()[name], wrapped=wrapped)
    result = plan_fast(0, body)
    if name == "service-update":
        assert result is None  # a class read verbatim: the reference decides
    else:
        assert isinstance(result, Planned), name


def test_bounds_come_from_the_limits() -> None:
    body = novagen.notification(seed=3)
    body["payload"]["nova_object.data"]["display_name"] = "n" * limits.NAME_LENGTH
    assert decode_fast(novagen.body(body)).data.display_name == "n" * limits.NAME_LENGTH
    body["payload"]["nova_object.data"]["display_name"] += "n"
    with pytest.raises(msgspec.ValidationError, match="display_name"):
        decode_fast(novagen.body(body))


# Nova's other instance classes, read by shape ----------------------------------------
def _by_shape(name: str, seed: int = 5) -> dict[str, Any]:
    body = novagen.notification("instance.exists", seed=seed)
    body["payload"]["nova_object.name"] = name
    return body


def _code(result: Planned | Outcome) -> str | None:
    assert isinstance(result, Outcome) and result.verdict is Verdict.DEAD
    return result.reason_code


def _same_plan(fast: Planned, reference: Planned | Outcome) -> None:
    assert isinstance(reference, Planned)
    assert (fast.op.id, fast.op.version) == (reference.op.id, reference.op.version)
    assert fast.op.document | {"indexed_at": None} == reference.op.document | {"indexed_at": None}


def test_the_shaped_struct_is_instance_payload_with_its_shape_fields_unset() -> None:
    fields = {f.name: f for f in msgspec.structs.fields(fastdecode._SHAPED_DATA)}
    assert list(fields) == list(InstancePayload.model_fields)
    for name in InstancePayload.SHAPE_FIELDS - {"uuid"}:
        assert fields[name].default is msgspec.UNSET, name
    assert fields["uuid"].required


@pytest.mark.parametrize("name", NOVA_INSTANCE_SUBCLASSES)
def test_novas_other_instance_classes_take_the_compiled_path(name: str) -> None:
    raw = novagen.body(_by_shape(name))
    fast = plan_fast(0, raw)
    assert isinstance(fast, Planned), name
    _same_plan(fast, reference_plan(raw))
    assert decode_fast(raw).obj_name == name


def test_any_major_version_is_read_by_shape_as_the_registry_does() -> None:
    body = _by_shape("InstanceExistsPayload")
    body["payload"]["nova_object.version"] = "7.3"
    raw = novagen.body(body)
    fast = plan_fast(0, raw)
    assert isinstance(fast, Planned)
    _same_plan(fast, reference_plan(raw))
    body["payload"]["nova_object.version"] = "7"
    assert plan_fast(0, novagen.body(body)) is None  # the reference names the error
    assert _code(reference_plan(novagen.body(body))) == "malformed"


def _same_verdict(got: Planned | Outcome | None, reference: Planned | Outcome) -> None:
    if isinstance(reference, Planned):
        assert isinstance(got, Planned)
        _same_plan(got, reference)
    else:
        assert isinstance(got, Outcome) and got.reason_code == reference.reason_code


@settings(max_examples=200, deadline=None)
@given(
    version=st.one_of(
        st.builds("1.{}".format, st.integers(0, fastdecode.NESTED_MINORS + 50)),
        st.sampled_from(
            ["1.07", "1.4 ", "01.4", "1", "2.0", "0.9", "1.-1", "1.4.1", "\u0661.\u0664"]
        ),
        st.text(max_size=8),
    )
)
def test_a_nested_objects_version_decides_as_the_reference_does(version: str) -> None:
    """Minors of the known major up to ``NESTED_MINORS`` take the compiled path; any
    other version declines, and the reference's verdict stands (the indexer's planner too)."""
    body = novagen.notification("instance.update", seed=11)
    body["payload"]["nova_object.data"]["flavor"]["nova_object.version"] = version
    raw = novagen.body(body)
    fast = plan_fast(0, raw)
    if version in {f"1.{minor}" for minor in range(fastdecode.NESTED_MINORS)}:
        assert isinstance(fast, Planned)
    elif fast is not None:
        raise AssertionError(f"the compiled path decided version {version!r}")
    outcomes, planned = plan([raw])
    _same_verdict(planned[0] if planned else outcomes[0], reference_plan(raw))


@pytest.mark.parametrize("wrapped", [True, False], ids=["oslo", "bare"])
@pytest.mark.parametrize("version", ["1.4", "1.05", "1.100"])
def test_a_declined_nested_version_gets_the_references_verdict_on_the_known_difference(
    version: str, wrapped: bool
) -> None:
    """The fast path's one known difference (an undeclared number past a double's range
    in an oslo-wrapped message, which it skips unread) stays with the versions it reads;
    any other gets the reference's verdict, malformed, where the version pattern let it
    through. A bare body is parsed whole by orjson first, as the reference parses it, so
    there is no difference there."""
    body = novagen.notification("instance.update", seed=11)
    body["payload"]["nova_object.data"]["flavor"]["nova_object.version"] = version
    text = novagen.body(body, wrapped=False).decode()
    bare = text.replace('"nova_object.data": {', '"nova_object.data": {"zz": 1e400, ', 1)
    assert bare != text
    raw = json.dumps({"oslo.version": "2.0", "oslo.message": bare}) if wrapped else bare
    outcomes, planned = plan([raw.encode()])
    if version == "1.4" and wrapped:
        assert planned  # the documented difference: the reference calls it malformed
    else:
        assert not planned and _code(reference_plan(raw.encode())) == "malformed"
        _same_verdict(outcomes[0], reference_plan(raw.encode()))


@settings(max_examples=150, deadline=None)
@given(
    absent=st.sets(st.sampled_from(sorted(InstancePayload.SHAPE_FIELDS))),
    nulls=st.sets(st.sampled_from(sorted(InstancePayload.SHAPE_FIELDS - {"uuid"}))),
)
def test_the_shape_decides_alike_on_both_paths(absent: set[str], nulls: set[str]) -> None:
    """Absent fields count against the shape, null ones for it (as key presence does)."""
    body = _by_shape("InstanceExistsPayload", seed=len(absent))
    data = body["payload"]["nova_object.data"]
    for name in nulls:
        data[name] = None
    for name in absent:
        del data[name]
    raw = novagen.body(body)
    fast, reference = plan_fast(0, raw), reference_plan(raw)
    shaped = (len(InstancePayload.SHAPE_FIELDS) - len(absent)) * 2 > len(
        InstancePayload.SHAPE_FIELDS
    )
    if isinstance(fast, Planned):
        assert shaped
        _same_plan(fast, reference)
    if not shaped:
        assert fast is None
        assert _code(reference) == "not_an_instance"
    elif isinstance(reference, Planned) and not (nulls & {"ip_addresses", "metadata"}):
        # Null where the model has no None is the reference's error; else both plan.
        assert isinstance(fast, Planned)


def test_invalid_utf8_in_a_skipped_field_is_left_to_thereference_plan() -> None:
    """msgspec does not read what it skips; the reference refuses the whole body."""
    wrapped = novagen.body(_by_shape("InstanceExistsPayload"))
    bare = novagen.body(_by_shape("InstanceExistsPayload"), wrapped=False)
    for raw in (
        wrapped[:-1] + b', "x": "\xff"}',
        bare.replace(b'"bandwidth":', b'"zzz": "\xff", "bandwidth":'),
        bare.replace(b'"bandwidth":', b'"\xff": 1, "bandwidth":'),
    ):
        assert plan_fast(0, raw) is None
        assert _code(reference_plan(raw)) == "malformed"
    assert isinstance(plan_fast(0, memoryview(wrapped)), Planned)


def test_an_empty_cell_uuid_is_no_cell_on_both_paths() -> None:
    for event_type in ("instance.exists", "instance.pause.end"):
        body = novagen.notification(event_type, seed=5)
        body["payload"]["nova_object.data"]["cell_uuid"] = ""
        raw = novagen.body(body)
        fast = plan_fast(0, raw)
        assert isinstance(fast, Planned) and fast.op.document["cell_uuid"] is None
        _same_plan(fast, reference_plan(raw))


def test_ever_new_minor_versions_grow_neither_memory_nor_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each newer minor's unknown fields are logged once, for at most ``LOGGED_VERSIONS``
    versions; past that, messages of new versions are still indexed, and nothing more is
    remembered or logged (a probe's 20,000 distinct minors had grown the consumer by 80
    MB and logged 19,000 lines)."""
    body = novagen.notification("instance.update", seed=5)
    count = base.LOGGED_VERSIONS + 200
    with caplog.at_level(logging.INFO, logger="cellsight.notifications.base"):
        for n in range(count):
            body["payload"]["nova_object.version"] = f"2.{10_000 + n}"
            outcomes, planned = plan([novagen.body(body)])
            assert len(planned) == 1 and not any(outcomes), outcomes
    assert len(base._logged_unknown) <= base.LOGGED_VERSIONS
    assert len(fastdecode._seen_newer) <= base.LOGGED_VERSIONS
    logged = [r for r in caplog.records if "fields kept out of documents" in r.getMessage()]
    assert 0 < len(logged) <= base.LOGGED_VERSIONS < count


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
        _same_verdict(fast, reference)
    outcomes, planned = plan([raw])
    _same_verdict(planned[0] if planned else outcomes[0], reference)


def test_a_memoryview_is_measured_and_read_as_the_reference_reads_it() -> None:
    """A body's size is its bytes, not a view's items, and a view that is not contiguous
    is refused by the reference's parser: the compiled path declines both (a review
    found them planned)."""
    wrapped = novagen.body(novagen.notification("instance.update", seed=3))
    padded = wrapped + b" " * (limits.MAX_BODY_BYTES - len(wrapped) + 8)
    padded += b" " * (-len(padded) % 4)
    view = memoryview(padded).cast("I")
    assert view.nbytes > limits.MAX_BODY_BYTES > len(view)
    assert plan_fast(0, view) is None and _code(reference_plan(view.tobytes())) == "too_large"
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
        _same_plan(fast, reference)
    if fastcheck.time_ok(text) and isinstance(reference, Planned):
        assert isinstance(fast, Planned)


@pytest.mark.parametrize("nested", [False, True], ids=["payload", "flavor"])
@pytest.mark.parametrize(
    "digits",
    [{ord(d): chr(0xFF10 + int(d)) for d in "0123456789"}, str.maketrans({"1": "\u00b9"})],
    ids=["fullwidth", "superscript"],
)
def test_a_version_of_other_digits_is_malformed_in_the_schemas_words(
    nested: bool, digits: dict[int, str]
) -> None:
    """An adversarial probe: isdigit() took a fullwidth "2.1" (read by int() as 2.1 and indexed,
    where the exported schema's pattern is ASCII) and "2.¹" (dead-lettered with Python's
    "invalid literal for int()")."""
    body = novagen.notification("instance.update", seed=12)
    data = body["payload"]
    target = data["nova_object.data"]["flavor"] if nested else data
    target["nova_object.version"] = target["nova_object.version"].translate(digits)
    assert not target["nova_object.version"].isascii()
    outcomes, planned = plan([novagen.body(body)])
    assert not planned
    (outcome,) = outcomes
    assert isinstance(outcome, Outcome) and outcome.verdict is Verdict.DEAD
    assert outcome.reason_code == "malformed", outcome
    assert "is not 'major.minor'" in (outcome.reason or ""), outcome.reason
    assert "invalid literal" not in (outcome.reason or "")
