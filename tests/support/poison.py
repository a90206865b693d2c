"""A fixed corpus of poison messages, each with the dead-letter reason it must get, and
edge cases the contract accepts (they must be indexed, not dead-lettered).

Every body is the bytes a producer could put on the bus; each is built from a
realistic generated notification (``tests.support.novagen``) with one thing wrong.
"""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable
from typing import Any

from cellsight.notifications.limits import PARSER_MAX_DEPTH
from tests.support import novagen

Body = dict[str, Any]


def good(seed: int = 7, event_type: str = "instance.pause.end") -> Body:
    return novagen.notification(event_type, seed=seed)


def data(body: Body) -> dict[str, Any]:
    inner: dict[str, Any] = body["payload"]["nova_object.data"]
    return inner


def variant(change: Callable[[Body], Any], *, wrapped: bool = True, seed: int = 7) -> bytes:
    body = copy.deepcopy(good(seed))
    change(body)
    return novagen.body(body, wrapped=wrapped)


def raw_field(name: str, literal: str) -> bytes:
    """A body whose payload field ``name`` is the raw JSON text ``literal`` (which the
    json module cannot write: NaN, a thousand-digit integer, a lone surrogate)."""
    marker = "__RAW__"
    text = json.dumps(good() | {"payload": _with(good()["payload"], name, marker)})
    return text.replace(json.dumps(marker), literal).encode()


def _with(payload: Body, name: str, value: Any) -> Body:
    payload = copy.deepcopy(payload)
    if name.startswith("flavor."):
        payload["nova_object.data"]["flavor"]["nova_object.data"][name[7:]] = value
    else:
        payload["nova_object.data"][name] = value
    return payload


UUID_TEXT = "3c6b1a4e-92f3-4d6f-9b0e-5a1f2c3d4e5f"


def nested_objects(depth: int) -> str:
    """JSON text of objects nested ``depth`` deep (the json module stops near 1,000)."""
    return '{"a": ' * depth + '"x"' + "}" * depth


def nested_arrays(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def _set(**fields: Any) -> Callable[[Body], Any]:
    return lambda b: data(b).update(fields)


def _env(**fields: Any) -> Callable[[Body], Any]:
    return lambda b: b.update(fields)


def _flavor(**fields: Any) -> Callable[[Body], Any]:
    return lambda b: data(b)["flavor"]["nova_object.data"].update(fields)


def corpus() -> dict[str, tuple[bytes, str]]:
    """kind → (body, expected dead-letter reason code)."""
    bare = good()
    deep = "[" * 5000 + "]" * 5000
    service = novagen.service_update() | {"event_type": "instance.pause.end"}
    items: dict[str, tuple[bytes, str]] = {
        # Not JSON at all
        "empty_body": (b"", "malformed"),
        "whitespace_body": (b" \n\t ", "malformed"),
        "truncated_json": (novagen.body(bare)[:-20], "malformed"),
        "invalid_utf8": (b'{"event_type": "\xff\xfe"}', "malformed"),
        "utf16_body": (json.dumps(bare).encode("utf-16"), "malformed"),
        "utf8_bom": (b"\xef\xbb\xbf" + json.dumps(bare).encode(), "malformed"),
        "pickle_body": (pickle.dumps(bare), "malformed"),
        "yaml_body": (b"event_type: instance.pause.end\npriority: INFO\n", "malformed"),
        "nan_value": (raw_field("progress", "NaN"), "malformed"),
        "infinity_value": (raw_field("flavor.rxtx_factor", "Infinity"), "malformed"),
        "float_overflow": (raw_field("flavor.rxtx_factor", "1e400"), "malformed"),
        "thousand_digit_int": (raw_field("progress", "9" * 1000), "malformed"),
        "lone_surrogate": (raw_field("display_name", '"\\ud800"'), "malformed"),
        "deep_nesting_body": (deep.encode(), "malformed"),
        "deep_nesting_field": (raw_field("shiny_new_field", deep), "malformed"),
        "nesting_just_past_limit": (
            raw_field("shiny_new_field", "[" * PARSER_MAX_DEPTH + "]" * PARSER_MAX_DEPTH),
            "malformed",
        ),
        "huge_body_20mb": (
            variant(_set(display_name="x" * (20 * 1024 * 1024))),
            "too_large",
        ),
        # Out of the contract's bounds
        "int_beyond_long": (raw_field("progress", str(2**63)), "out_of_range"),
        "int_below_long": (raw_field("flavor.memory_mb", str(-(2**63) - 1)), "out_of_range"),
        "thirty_digit_int": (raw_field("flavor.vcpus", "1" + "0" * 30), "out_of_range"),
        "display_name_256": (variant(_set(display_name="n" * 256)), "out_of_range"),
        "description_70k": (variant(_set(display_description="d" * 70_000)), "out_of_range"),
        "metadata_1001_keys": (
            variant(_set(metadata={f"k{i}": "v" for i in range(1001)})),
            "out_of_range",
        ),
        "metadata_value_256": (variant(_set(metadata={"k": "v" * 256})), "out_of_range"),
        "updated_at_past_9999": (
            variant(_set(updated_at="9999-12-31T23:59:59-01:00")),
            "out_of_range",
        ),
        "created_at_before_year_1": (
            variant(_set(created_at="0001-01-01T00:00:00+01:00")),
            "out_of_range",
        ),
        "envelope_timestamp_past_9999": (
            variant(_env(timestamp="9999-12-31T23:59:59-01:00")),
            "out_of_range",
        ),
        # ISO 8601 allows a leap second; no Python datetime (so no Nova time) holds one.
        "updated_at_leap_second": (variant(_set(updated_at="2016-12-31T23:59:60Z")), "malformed"),
        # Second 60 in a time that is invalid for another reason: that reason is named.
        "updated_at_month_13_second_60": (
            variant(_set(updated_at="2016-13-31T23:59:60Z")),
            "malformed",
        ),
        "envelope_timestamp_leap_second": (
            variant(_env(timestamp="2016-12-31 23:59:60.000000")),
            "invalid_envelope",
        ),
        # A Nova payload's version derives from its times: after 2255 it leaves a long.
        "version_past_2255": (variant(_set(updated_at="9999-12-31T23:59:59Z")), "out_of_range"),
        "event_type_300": (variant(_env(event_type="instance." + "a" * 300)), "out_of_range"),
        # Wrong shapes
        "json_scalar": (b"42", "invalid_envelope"),
        "json_null": (b"null", "invalid_envelope"),
        "json_array": (json.dumps([bare]).encode(), "invalid_envelope"),
        "oslo_message_not_string": (
            json.dumps({"oslo.version": "2.0", "oslo.message": bare}).encode(),
            "invalid_envelope",
        ),
        "oslo_message_not_json": (
            json.dumps({"oslo.version": "2.0", "oslo.message": "{nope"}).encode(),
            "malformed",
        ),
        "oslo_double_wrapped": (
            json.dumps(novagen.oslo(novagen.oslo(bare))).encode(),
            "invalid_envelope",
        ),
        "payload_is_list": (variant(_env(payload=[1, 2])), "malformed"),
        "payload_lacks_data": (
            variant(lambda b: b["payload"].pop("nova_object.data")),
            "malformed",
        ),
        "data_is_string": (
            variant(lambda b: b["payload"].update({"nova_object.data": "x"})),
            "malformed",
        ),
        "flavor_wrong_name": (
            variant(lambda b: data(b)["flavor"].update({"nova_object.name": "IpPayload"})),
            "malformed",
        ),
        "flavor_is_list": (variant(_set(flavor=[1])), "malformed"),
        # oslo.versionedobjects reads an object only of its project's namespace.
        "payload_foreign_namespace": (
            variant(lambda b: b["payload"].update({"nova_object.namespace": "glance"})),
            "malformed",
        ),
        "flavor_foreign_namespace": (
            variant(lambda b: data(b)["flavor"].update({"nova_object.namespace": "glance"})),
            "malformed",
        ),
        "version_not_numeric": (
            variant(lambda b: b["payload"].update({"nova_object.version": "1.x"})),
            "malformed",
        ),
        "unknown_major_version": (
            variant(lambda b: b["payload"].update({"nova_object.version": "2.0"})),
            "unknown_major_version",
        ),
        "nested_major_version": (
            variant(lambda b: data(b)["flavor"].update({"nova_object.version": "2.0"})),
            "unknown_major_version",
        ),
        "uuid_not_uuid": (variant(_set(uuid="not-a-uuid")), "malformed"),
        # uuid.UUID reads these too; each would be one more id for the same instance.
        "uuid_in_braces": (variant(_set(uuid="{" + UUID_TEXT + "}")), "malformed"),
        "uuid_urn": (variant(_set(uuid="urn:uuid:" + UUID_TEXT)), "malformed"),
        "uuid_bare_hex": (variant(_set(uuid=UUID_TEXT.replace("-", ""))), "malformed"),
        # Under the parser's depth bound, but no repr of it fits in an error message.
        "metadata_nested_1000": (raw_field("metadata", nested_objects(1000)), "malformed"),
        "extra_specs_nested_1000": (
            raw_field("flavor.extra_specs", nested_objects(1000)),
            "malformed",
        ),
        "version_4000_digit_minor": (
            variant(lambda b: b["payload"].update({"nova_object.version": "1." + "9" * 4000})),
            "out_of_range",
        ),
        "uuid_null": (variant(_set(uuid=None)), "missing_field"),
        "ip_address_int": (
            variant(lambda b: data(b)["ip_addresses"][0]["nova_object.data"].update(address=4)),
            "malformed",
        ),
        # Values no Nova object can hold, which Tempest's server schemas refuse.
        "ip_address_not_an_ip": (
            variant(lambda b: data(b)["ip_addresses"][0]["nova_object.data"].update(address="x")),
            "malformed",
        ),
        "ip_address_scoped": (
            variant(
                lambda b: data(b)["ip_addresses"][0]["nova_object.data"].update(address="fe80::1%0")
            ),
            "malformed",
        ),
        "mac_not_a_mac": (
            variant(
                lambda b: data(b)["ip_addresses"][0]["nova_object.data"].update(mac="fa:16:3e")
            ),
            "malformed",
        ),
        "tag_with_comma": (variant(_set(tags=["a,b"])), "malformed"),
        "tag_61": (variant(_set(tags=["t" * 61])), "out_of_range"),
        "tags_51": (variant(_set(tags=[f"t{i}" for i in range(51)])), "out_of_range"),
        "priority_not_string": (variant(_env(priority=123)), "invalid_envelope"),
        "priority_unknown": (variant(_env(priority="LOUD")), "invalid_envelope"),
        "event_type_bad": (variant(_env(event_type="instance")), "invalid_event_type"),
        "locked_maybe": (variant(_set(locked="maybe")), "malformed"),
        "not_an_instance": (novagen.body(service), "not_an_instance"),
    }
    return items


def accepted() -> dict[str, tuple[bytes, str]]:
    """kind → (body, instance uuid): values the contract allows; they are indexed."""
    out: dict[str, tuple[bytes, str]] = {}

    def add(kind: str, seed: int, change: Callable[[Body], Any]) -> None:
        body = copy.deepcopy(good(seed))
        change(body)
        out[kind] = (novagen.body(body), data(body)["uuid"])

    add("nul_in_string", 101, _set(display_name="nul\x00inside"))
    add(
        "naive_times", 102, _set(updated_at="2024-05-02T10:00:00", created_at="2024-05-01 09:00:00")
    )
    add("offset_times", 103, _set(updated_at="2024-05-02T10:00:00+05:30"))
    add(
        "newer_minor",
        104,
        lambda b: (
            b["payload"].update({"nova_object.version": "1.99"}),
            data(b).update(shiny_new_field={"nested": [1, 2]}),
        ),
    )
    add(
        "unknown_class_by_shape",
        105,
        lambda b: b["payload"].update({"nova_object.name": "InstanceActionRescuePayload"}),
    )
    # An unknown field the contract keeps aside may nest deeply, up to the parser's limit.
    add("nesting_100_in_extra_field", 111, _set(shiny_new_field=nested_arrays(100)))
    add("display_name_255", 106, _set(display_name="n" * 255))
    add("long_max", 107, _flavor(memory_mb=2**63 - 1))
    add("lax_int_as_string", 108, _set(progress="5"))
    add("year_2200_utc", 109, _set(updated_at="2200-12-31T23:59:59Z"))
    # Duplicate keys: the last one wins (as in json.loads); the body is written by hand.
    body = copy.deepcopy(good(110))
    data(body)["display_name"] = "__FIRST__"
    text = json.dumps(body).replace(
        '"display_name": "__FIRST__"', '"display_name": "first", "display_name": "last"'
    )
    out["duplicate_keys"] = (text.encode(), data(body)["uuid"])
    return out
