"""Hypothesis over every field of the payload and the envelope, with extreme values,
through the indexer's decode step: it never raises, every message is planned or dead
with a contract reason (never ``internal``), and whenever the compiled path accepts a
message the reference decoder accepts it too and maps it to the same document.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cellsight.indexer.outcomes import Verdict
from cellsight.indexer.planning import EventInfo, Planned, map_payload, plan, plan_fast
from cellsight.notifications.base import UUID_PATTERN
from cellsight.notifications.envelope import decode
from cellsight.notifications.payloads import FlavorPayload, InstanceActionPayload, IpPayload
from tests.notifications.test_forms import UUID_TEXTS
from tests.support import novagen, poison
from tests.support.decoding import reference_planned

KNOWN_CODES = {
    "malformed",
    "invalid_envelope",
    "invalid_event_type",
    "missing_field",
    "unknown_major_version",
    "out_of_range",
    "too_large",
    "not_an_instance",
    "not_a_node",
}

# Every field a producer writes, by where it sits in the wire form.
ENVELOPE = ["event_type", "publisher_id", "priority", "timestamp", "message_id", "payload"]
WRAPPER = ["nova_object.name", "nova_object.namespace", "nova_object.version", "nova_object.data"]
PAYLOAD = [*InstanceActionPayload.model_fields, "cell_uuid", "revision", "forthcoming"]
FLAVOR = list(FlavorPayload.model_fields)
IP = list(IpPayload.model_fields)

_times = st.datetimes(
    min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)
).flatmap(
    lambda dt: st.sampled_from(
        [
            dt.isoformat(),
            dt.isoformat() + "Z",
            dt.replace(tzinfo=timezone(timedelta(hours=-1))).isoformat(),
            dt.replace(tzinfo=timezone(timedelta(hours=14))).isoformat(),
            dt.isoformat(sep=" "),
        ]
    )
)
_specials = st.sampled_from(
    [
        "",
        "n" * 255,
        "n" * 256,
        "d" * 65536,
        "\x00",
        "9999-12-31T23:59:59-01:00",
        "0001-01-01T00:00:00+01:00",
        "2024-05-01T10:00:31.1234567Z",
        "2024-05-01T10:00:31Z\n",
        "2024-05-01",
        "1.9",
        "1.9\n",
        "2.0",
        "1.99",
        "{178b0921-8f85-4257-88b6-2e743b5a975c}",
        "178b0921-8f85-4257-88b6-2e743b5a975c",
        "178b0921-8f85-4257-88b6-2e743b5a975c\n",
        "instance.pause.end",
        "INFO",
        "nova",
        "FlavorPayload",
    ]
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 0, 1, -1, 6, 4]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    _specials,
    _times,
)
VALUES = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
WHERE = st.one_of(
    st.tuples(st.just("envelope"), st.sampled_from(ENVELOPE)),
    st.tuples(st.just("wrapper"), st.sampled_from(WRAPPER)),
    st.tuples(st.just("payload"), st.sampled_from(PAYLOAD)),
    st.tuples(st.just("flavor"), st.sampled_from(FLAVOR)),
    st.tuples(st.just("ip"), st.sampled_from(IP)),
)


def mutate(body: dict[str, Any], where: tuple[str, str], value: Any, drop: bool) -> None:
    place, key = where
    data = body["payload"]["nova_object.data"]
    target = {
        "envelope": body,
        "wrapper": body["payload"],
        "payload": data,
        "flavor": data["flavor"]["nova_object.data"],
        "ip": data["ip_addresses"][0]["nova_object.data"],
    }[place]
    if drop:
        target.pop(key, None)
    else:
        target[key] = value


def reference_document(body: bytes) -> dict[str, Any] | None:
    planned = reference_planned(body)
    return None if planned is None else planned.op.document


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "indexed_at"}


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    seed=st.integers(0, 2**16),
    event_type=st.sampled_from(sorted(novagen.EVENT_CLASSES)),
    changes=st.lists(st.tuples(WHERE, VALUES, st.booleans()), min_size=1, max_size=3),
    wrapped=st.booleans(),
)
def test_any_field_any_value_is_planned_or_dead_with_a_reason(
    seed: int, event_type: str, changes: list[Any], wrapped: bool
) -> None:
    body = copy.deepcopy(novagen.notification(event_type, seed=seed))
    for where, value, drop in changes:
        # An earlier change may have replaced the container this one targets.
        with contextlib.suppress(KeyError, TypeError, IndexError):
            mutate(body, where, value, drop)
    raw = json.dumps(novagen.oslo(body) if wrapped else body).encode()

    outcomes, planned = plan([raw, novagen.body(poison.good(seed=seed + 1))])
    assert len(planned) >= 1 and planned[-1].position == 1  # the neighbour is planned
    outcome = outcomes[0]
    if outcome is not None and outcome.verdict is Verdict.DEAD:
        assert outcome.reason_code in KNOWN_CODES, outcome.reason
        assert outcome.reason

    fast = plan_fast(0, raw)
    if isinstance(fast, Planned):
        reference = reference_planned(raw)
        assert reference is not None, "the compiled path accepted what the reference refuses"
        assert _comparable(fast.op.document) == _comparable(reference.op.document)
        # What the writer reads besides the document: the purge floor's snapshot time,
        # the version, the event and its time.
        assert fast.snapshot_at == reference.snapshot_at
        assert (fast.op.id, fast.op.version) == (reference.op.id, reference.op.version)
        assert fast.notification == reference.notification


@settings(max_examples=150, deadline=None)
@given(
    when=st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2250, 1, 1)),
    offset_minutes=st.integers(-14 * 60, 14 * 60),
    micro_digits=st.integers(0, 9),
)
def test_times_read_alike_on_both_paths(
    when: datetime, offset_minutes: int, micro_digits: int
) -> None:
    tz = timezone(timedelta(minutes=offset_minutes))
    text = when.replace(tzinfo=tz).isoformat(timespec="seconds")
    if micro_digits:
        digits = f"{when.microsecond:06d}{when.microsecond % 1000:03d}"[:micro_digits]
        text = text[:19] + "." + digits + text[19:]
    body = novagen.notification(seed=1)
    body["payload"]["nova_object.data"]["updated_at"] = text
    raw = novagen.body(body)
    fast = plan_fast(0, raw)
    reference = reference_document(raw)
    assert reference is not None
    if isinstance(fast, Planned):
        assert fast.op.document["updated_at"] == reference["updated_at"]
    parsed = datetime.fromisoformat(reference["updated_at"].replace("Z", "+00:00"))
    assert parsed.tzinfo is not None and parsed.utcoffset() == timedelta(0)
    assert abs(parsed - when.replace(tzinfo=tz).astimezone(UTC)) < timedelta(seconds=1)


@settings(max_examples=200, deadline=None)
@given(text=UUID_TEXTS)
def test_uuids_read_alike_on_both_paths(text: str) -> None:
    """The compiled path matches the instance's uuid itself, after msgspec's decode:
    what it accepts the reference accepts as the same id, and Nova's form it accepts."""
    body = novagen.notification(seed=1)
    body["payload"]["nova_object.data"]["uuid"] = text
    raw = novagen.body(body)
    fast = plan_fast(0, raw)
    reference = reference_planned(raw)
    if isinstance(fast, Planned):
        assert reference is not None, "the compiled path accepted what the reference refuses"
        assert fast.op.id == reference.op.id == text
    if re.fullmatch(UUID_PATTERN, text):
        assert isinstance(fast, Planned)


def _with_payload(event_type: str, payload: dict[str, Any]) -> bytes:
    bare = {"event_type": event_type, "publisher_id": "x", "priority": "INFO", "payload": payload}
    return novagen.body(bare)


def _node_payload(**changes: Any) -> dict[str, Any]:
    from cellsight.notifications.objects import ComputeNodePayload

    node = ComputeNodePayload(
        uuid="7d3c1a2b-0e9f-4d8c-b7a6-5e4f3d2c1b0a",
        host="compute-1",
        hypervisor_hostname="compute-1.example",
        cell_uuid="cell1",
        memory_mb=65536,
        vcpus=32,
        updated_at="2024-05-01T10:00:00.123456Z",
        revision=7,
    )
    payload = node.to_primitive()
    payload["nova_object.data"].update(changes)
    return payload


def _node_body(**changes: Any) -> bytes:
    return _with_payload("compute_node.update", _node_payload(**changes))


@settings(max_examples=150, deadline=None)
@given(
    field=st.sampled_from(
        ["memory_mb", "vcpus_used", "host", "updated_at", "revision", "disabled", "uuid"]
    ),
    value=VALUES,
)
def test_node_payloads_map_alike_on_both_paths(field: str, value: Any) -> None:
    raw = _node_body(**{field: value})
    outcomes, _planned = plan([raw])
    if outcomes[0] is not None:
        assert outcomes[0].reason_code in KNOWN_CODES
    fast = plan_fast(0, raw)
    if isinstance(fast, Planned):
        n = decode(raw)
        reference = map_payload(0, n.payload, n.event, EventInfo(n.event_type, n.timestamp))
        assert isinstance(reference, Planned)
        assert _comparable(fast.op.document) == _comparable(reference.op.document)
        assert fast.op.version == reference.op.version and fast.op.resource == "node"


def test_a_node_payload_takes_the_compiled_path() -> None:
    fast = plan_fast(0, _node_body())
    assert isinstance(fast, Planned) and fast.op.resource == "node" and fast.op.version == 7
    assert fast.op.document["updated_at"] == "2024-05-01T10:00:00.123456Z"
    assert plan_fast(0, _node_body(memory_mb=-1)) is None  # declined: the reference decides
    outcomes, _ = plan([_node_body(memory_mb=-1)])
    assert outcomes[0] is not None and outcomes[0].reason_code == "malformed"


def test_a_node_payload_without_its_revision_is_dead_lettered_on_both_paths() -> None:
    """An adversarial probe: without ``revision`` a node's version came from its time
    (micros << 10, near 1.8e18), above every revision a row reaches, so every later
    update of that node was dropped as older and ``index verify`` called it ahead."""
    wire = _node_payload()
    del wire["nova_object.data"]["revision"]
    raw = _with_payload("compute_node.update", wire)
    assert plan_fast(0, raw) is None
    (outcome,), planned = plan([raw])
    assert not planned and outcome is not None
    assert outcome.reason_code == "missing_field" and "revision" in (outcome.reason or "")


def test_a_node_event_takes_a_node_payload_and_an_instance_event_an_instance_one() -> None:
    """A node event with another class was acked and counted as ignored (no dead letter
    to find it by), and a node's payload on an instance event was indexed as a node."""
    selection = novagen.selection()
    node = _node_payload()
    for event_type, payload, code in [
        ("compute_node.update", selection, "not_a_node"),
        ("instance.update", node, "not_an_instance"),
    ]:
        raw = _with_payload(event_type, payload)
        (outcome,), planned = plan([raw])
        assert not planned and outcome is not None, event_type
        assert outcome.reason_code == code, outcome.reason
        assert payload["nova_object.name"] in (outcome.reason or "")
    (outcome,), planned = plan([_with_payload("compute_node.update", node)])
    assert outcome is None and planned[0].op.resource == "node"
