"""The exported JSON Schema (``cellsight notifications schema``) and the contract agree
on addresses, MACs, tags and UUIDs: a standard validator, formats checked, accepts a
payload exactly when the indexer does not dead-letter it."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from cellsight.indexer.planning import plan
from cellsight.notifications.envelope import decode
from cellsight.notifications.errors import NotificationError
from cellsight.notifications.registry import REGISTRY
from cellsight.notifications.schema import payload_schema
from tests.notifications.test_forms import IP_TEXTS, MAC_TEXTS, TAGS, UUID_TEXTS
from tests.support import novagen

EVENTS = ["instance.pause.end", "instance.update", "instance.create.end"]


def _validator(name: str) -> Draft202012Validator:
    schema = payload_schema(REGISTRY["nova", name])
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


VALIDATORS = {name: _validator(name) for name in ("InstanceActionPayload", "InstanceUpdatePayload",
                                                  "InstanceCreatePayload")}  # fmt: skip


def _agree(event_type: str, seed: int, change: Callable[[dict[str, Any]], None]) -> bool:
    notification = copy.deepcopy(novagen.notification(event_type, seed=seed))
    payload = notification["payload"]
    change(payload["nova_object.data"])
    try:
        raw = novagen.body(notification)
    except UnicodeEncodeError:  # a lone surrogate: no producer can send it
        return True
    (outcome,), planned = plan([raw])
    indexed = outcome is None and len(planned) == 1
    assert indexed or (
        outcome is not None and outcome.reason_code in ("malformed", "out_of_range")
    ), outcome
    errors = list(VALIDATORS[payload["nova_object.name"]].iter_errors(payload))
    assert indexed == (not errors), (indexed, [e.message for e in errors][:3])
    return indexed


@settings(max_examples=300, deadline=None)
@given(
    address=IP_TEXTS,
    mac=MAC_TEXTS,
    event_type=st.sampled_from(EVENTS),
    seed=st.integers(0, 2**16),
)
def test_addresses_and_macs(address: str, mac: str, event_type: str, seed: int) -> None:
    def change(data: dict[str, Any]) -> None:
        data["ip_addresses"][0]["nova_object.data"].update(address=address, mac=mac)

    _agree(event_type, seed, change)


@settings(max_examples=300, deadline=None)
@given(
    tags=st.lists(TAGS, max_size=4) | st.integers(49, 52).map(lambda n: ["t"] * n),
    event_type=st.sampled_from(EVENTS),
    seed=st.integers(0, 2**16),
)
def test_tags(tags: list[str], event_type: str, seed: int) -> None:
    _agree(event_type, seed, lambda data: data.update(tags=tags))


@settings(max_examples=300, deadline=None)
@given(text=UUID_TEXTS, event_type=st.sampled_from(EVENTS), seed=st.integers(0, 2**16))
def test_uuids(text: str, event_type: str, seed: int) -> None:
    _agree(event_type, seed, lambda data: data.update(uuid=text))


def test_the_generated_notifications_pass_and_a_bad_value_of_each_kind_fails() -> None:
    """The properties above could hold vacuously; these verdicts are fixed."""
    assert _agree("instance.update", 1, lambda data: None)
    assert _agree("instance.update", 1, lambda data: data.update(uuid=str(uuid.uuid4())))
    for change in (
        lambda data: data.update(uuid=uuid.uuid4().hex),
        lambda data: data.update(tags=["a,b"]),
        lambda data: data.update(tags=["t"] * 51),
        lambda data: data["ip_addresses"][0]["nova_object.data"].update(address="1.2.3.04"),
        lambda data: data["ip_addresses"][0]["nova_object.data"].update(mac="fa-16-3e-00-00-00"),
    ):
        assert not _agree("instance.update", 1, change)


def _verdicts(field: str, text: str) -> tuple[bool, bool, bool]:
    """Whether the contract (the decoder of ``notifications validate`` and the indexer)
    takes ``text`` as the instance's ``field``, and whether the schema does, by its
    pattern alone and with its formats checked."""
    notification = copy.deepcopy(novagen.notification("instance.update", seed=3))
    payload = notification["payload"]
    payload["nova_object.data"][field] = text
    try:
        decode(novagen.body(notification))
        taken = True
    except NotificationError:
        taken = False
    schema = payload_schema(REGISTRY["nova", "InstanceUpdatePayload"])
    by_pattern = Draft202012Validator(schema).is_valid(payload)
    by_format = VALIDATORS["InstanceUpdatePayload"].is_valid(payload)
    return taken, by_pattern, by_format


def _time_text(moment: datetime, sep: str, digits: int, zone: str) -> str:
    fraction = f".{moment.microsecond:06d}{'0' * max(0, digits - 6)}"[: digits + 1]
    # %Y does not pad years below 1000 (glibc).
    day = f"{moment.year:04d}-{moment:%m-%d}"
    return f"{day}{sep}{moment:%H:%M:%S}{fraction if digits else ''}{zone}"


ZONES = st.sampled_from(["Z", "z", "", "+00:00", "-00:00"]) | st.builds(
    lambda sign, h, m: f"{sign}{h:02d}:{m:02d}",
    st.sampled_from("+-"),
    st.integers(0, 25),
    st.integers(0, 61),
)
TIME_TEXTS = st.builds(
    _time_text,
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)),
    st.sampled_from(["T", " ", "t"]),
    st.integers(0, 8),
    ZONES,
)


def _mutate(text: str, at: int, char: str) -> str:
    at %= len(text) + 1
    return text[:at] + char + text[at + 1 :]


@settings(max_examples=400, deadline=None)
@given(
    text=TIME_TEXTS
    | st.builds(_mutate, TIME_TEXTS, st.integers(0, 40), st.sampled_from("0123456789:-+.TZ \n")),
    field=st.sampled_from(["launched_at", "updated_at"]),
)
def test_a_time_the_schema_takes_the_contract_takes(text: str, field: str) -> None:
    """The schema's times are never looser than the contract's decoder, with or without a
    validator that checks ``format``. They were ``format: date-time`` alone: a validator
    that does not check it (jsonschema without rfc3339-validator) took any string, and
    one that does took a time before year 1 or past year 9999 in UTC and a final newline,
    all of which the decoder refuses. The schema is stricter than the decoder where that
    is harmless (a lower-case ``z``, seven digits of fraction: Nova writes neither). The
    indexer also refuses a Nova payload whose times pass 2255, where its derived version
    would not fit (README, "The version rule")."""
    taken, by_pattern, by_format = _verdicts(field, text)
    assert taken or not (by_pattern or by_format), text


@settings(max_examples=200, deadline=None)
@given(
    moment=st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    digits=st.sampled_from([0, 6]),
)
def test_novas_own_times_pass_both(moment: datetime, digits: int) -> None:
    """Nova's form (``T``, ``Z``, no fraction or six digits) of any time: both take it."""
    assert _verdicts("launched_at", _time_text(moment, "T", digits, "Z")) == (True, True, True)


def test_the_times_the_schema_refuses() -> None:
    """Fixed verdicts, so that the properties above cannot hold vacuously."""
    for text in (
        "2023-02-29T00:00:00Z",  # no such day
        "2026-11-27T23:59:60Z",  # a leap second: the decoder refuses it
        "2026-11-27T03:10:00.1234567Z",  # seven digits
        "0001-01-01T00:30:00+01:00",  # before year 1 in UTC
        "9999-12-31T23:59:59-01:00",  # after year 9999 in UTC
        "2026-11-27T03:10:00Z\n",
    ):
        _, by_pattern, by_format = _verdicts("launched_at", text)
        assert not by_pattern and not by_format, text
    assert _verdicts("launched_at", "2024-02-29T12:00:00+05:30") == (True, True, True)


def test_every_string_of_the_export_is_bounded_as_the_decoder_bounds_it() -> None:
    """A review: the models' own string cap left the config (so a cell's row read as
    stored can pass it), and the export lost the cap of list items, dict keys and dict
    values, which the decoder holds to 255 characters (``_check_items``)."""
    from cellsight.notifications import limits
    from cellsight.notifications.schema import payload_schema, schema_classes

    unbounded: list[str] = []
    capped: list[int] = []

    def walk(node: object, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "string" or where.endswith("/propertyNames"):
                if "maxLength" in node:
                    capped.append(node["maxLength"])
                elif not {"pattern", "const", "enum"} & node.keys():
                    unbounded.append(where)
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    for cls in schema_classes():
        walk(payload_schema(cls), cls.__name__)
    assert not unbounded, unbounded[:5]
    assert max(capped) == limits.TEXT_LENGTH
    extra_specs = payload_schema(
        next(c for c in schema_classes() if c.__name__ == "FlavorPayload")
    )["properties"]["nova_object.data"]["properties"]["extra_specs"]["anyOf"][0]
    assert extra_specs["additionalProperties"]["maxLength"] == limits.NAME_LENGTH
    assert extra_specs["propertyNames"]["maxLength"] == limits.NAME_LENGTH
