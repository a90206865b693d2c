"""The wire contract: round trips, decoding by shape, version rules, named errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cellsight.notifications.envelope import Priority, decode
from cellsight.notifications.errors import (
    InvalidEnvelope,
    InvalidEventType,
    MalformedNotification,
    MissingField,
    OutOfRange,
    UnknownMajorVersion,
)
from cellsight.notifications.event_types import KNOWN_EVENT_TYPES, NOVA_EVENT_TYPES
from cellsight.notifications.payloads import (
    FlavorPayload,
    GenericPayload,
    InstanceActionPayload,
    InstancePayload,
)
from cellsight.notifications.queues import routing_key

RESCUE_IMAGE = "a2459075-d96c-40d5-893e-577ff92e721c"


def load(samples_dir: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((samples_dir / f"{name}.json").read_text())
    return data


@pytest.fixture
def pause_end(nova_like_dir: Path) -> dict[str, Any]:
    return load(nova_like_dir, "instance-pause-end")


def data_of(notification: dict[str, Any]) -> dict[str, Any]:
    inner: dict[str, Any] = notification["payload"]["nova_object.data"]
    return inner


def wrap(notification: dict[str, Any]) -> dict[str, Any]:
    return {"oslo.version": "2.0", "oslo.message": json.dumps(notification)}


def test_nova_samples_name_only_event_types_the_contract_lists(
    nova_sample_paths: list[Path],
) -> None:
    """Conformance: the indexer's metrics always keep a label for Nova's event types, so
    the list must hold every one Nova's samples carry."""
    event_types = {json.loads(p.read_text())["event_type"] for p in nova_sample_paths}
    assert event_types and event_types <= NOVA_EVENT_TYPES, event_types - NOVA_EVENT_TYPES


def test_the_generated_samples_name_only_event_types_the_contract_lists(
    sample_paths: list[Path],
) -> None:
    event_types = {json.loads(p.read_text())["event_type"] for p in sample_paths}
    assert event_types and event_types <= KNOWN_EVENT_TYPES, event_types - KNOWN_EVENT_TYPES


# Round trips ------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["nova", "generated"])
def test_every_sample_round_trips(which: str, request: pytest.FixtureRequest) -> None:
    """Conformance with Nova's own samples, and the generated ones."""
    fixture = "nova_sample_paths" if which == "nova" else "sample_paths"
    for path in request.getfixturevalue(fixture):
        original = json.loads(path.read_text())
        notification = decode(original)
        assert notification.to_dict() == original, path.name
        assert decode(path.read_bytes()).to_dict() == original, path.name
        # Through the oslo.messaging wrapper, as a dict and as the bytes on the bus.
        assert decode(wrap(original)).to_dict() == original, path.name
        on_bus = json.dumps(notification.to_oslo()).encode()
        assert decode(on_bus).to_dict() == original, path.name


def test_routing_keys_follow_the_priority(nova_like_dir: Path) -> None:
    assert decode(load(nova_like_dir, "instance-create-error")).priority is Priority.ERROR
    assert routing_key(Priority.ERROR) == "versioned_notifications.error"
    assert routing_key("info") == "versioned_notifications.info"
    assert routing_key("warning") == "versioned_notifications.warn"


def test_unknown_instance_class_decodes_by_shape(pause_end: dict[str, Any]) -> None:
    pause_end["payload"]["nova_object.name"] = "InstanceActionRescuePayload"
    data_of(pause_end)["rescue_image_ref"] = RESCUE_IMAGE
    notification = decode(pause_end)
    payload = notification.payload
    assert type(payload) is InstancePayload
    assert payload.obj_name == "InstanceActionRescuePayload"
    assert payload.extra_fields["rescue_image_ref"] == RESCUE_IMAGE
    assert "rescue_image_ref" not in InstancePayload.model_fields
    assert payload.uuid == data_of(pause_end)["uuid"]
    assert notification.to_dict() == pause_end  # under its own name, extras included
    assert decode(wrap(pause_end)).to_dict() == pause_end


def test_an_object_of_another_namespace_is_malformed(pause_end: dict[str, Any]) -> None:
    """As oslo.versionedobjects refuses it; an instance's shape under another project's
    namespace was read as one of Nova's instances, and a nested one was not looked at."""
    foreign = json.loads(json.dumps(pause_end))
    foreign["payload"]["nova_object.namespace"] = "glance"
    with pytest.raises(MalformedNotification, match="of namespace 'glance', neither Nova"):
        decode(foreign)
    data_of(pause_end)["flavor"]["nova_object.namespace"] = "cellsight"
    with pytest.raises(
        MalformedNotification,
        match=r"field flavor: .*FlavorPayload of namespace 'cellsight', not nova",
    ):
        decode(pause_end)


def test_an_unknown_class_of_cellsight_is_kept_verbatim(pause_end: dict[str, Any]) -> None:
    """Read by shape only in Nova's namespace: a later Cellsight's new class is no
    instance of Nova's, whatever its fields."""
    pause_end["payload"]["nova_object.namespace"] = "cellsight"
    pause_end["payload"]["nova_object.name"] = "NodeStatePayload"
    payload = decode(pause_end).payload
    assert type(payload) is GenericPayload
    assert payload.obj_namespace == "cellsight" and payload.obj_name == "NodeStatePayload"


def test_other_objects_are_kept_verbatim(nova_like_dir: Path) -> None:
    original = load(nova_like_dir, "service-update")
    payload = decode(original).payload
    assert type(payload) is GenericPayload
    assert payload.to_primitive() == original["payload"]


# Version rules ----------------------------------------------------------------------


def test_newer_minor_is_accepted_and_unknown_fields_kept_aside(pause_end: dict[str, Any]) -> None:
    pause_end["payload"]["nova_object.version"] = "1.42"
    data_of(pause_end)["shiny_new_field"] = {"nested": True}
    payload = decode(pause_end).payload
    assert type(payload) is InstanceActionPayload
    assert payload.obj_version == "1.42"
    assert "shiny_new_field" not in type(payload).model_fields
    assert payload.extra_fields == {"shiny_new_field": {"nested": True}}
    assert decode(pause_end).to_dict() == pause_end


def test_older_minor_fills_defaults(pause_end: dict[str, Any]) -> None:
    pause_end["payload"]["nova_object.version"] = "1.0"
    absent = (
        "locked",
        "locked_reason",
        "block_devices",
        "shares",
        "request_id",
        "action_initiator_project",
        "action_initiator_user",
        "metadata",
        "ip_addresses",
    )
    for name in absent:
        del data_of(pause_end)[name]
    payload = decode(pause_end).payload
    assert isinstance(payload, InstanceActionPayload)
    assert payload.obj_version == "1.0"
    assert payload.locked is False
    assert payload.block_devices is None and payload.shares is None
    assert payload.request_id is None and payload.locked_reason is None
    assert payload.metadata == {} and payload.ip_addresses == []
    assert payload.extra_fields == {}


@pytest.mark.parametrize("version", ["2.0", "0.9"])
def test_other_major_is_rejected(pause_end: dict[str, Any], version: str) -> None:
    pause_end["payload"]["nova_object.version"] = version
    with pytest.raises(UnknownMajorVersion) as caught:
        decode(pause_end)
    error = caught.value
    assert (error.name, error.version, error.supported) == ("InstanceActionPayload", version, "1.9")
    assert f"InstanceActionPayload version {version}" in str(error)
    assert "supports InstanceActionPayload 1.9" in str(error)
    assert error.reason == "unknown_major_version"


def test_other_major_of_a_nested_object_is_rejected(pause_end: dict[str, Any]) -> None:
    data_of(pause_end)["flavor"]["nova_object.version"] = "2.0"
    with pytest.raises(UnknownMajorVersion) as caught:
        decode(pause_end)
    assert (caught.value.name, caught.value.version) == ("FlavorPayload", "2.0")
    assert caught.value.supported == FlavorPayload.OBJ_VERSION
    assert "FlavorPayload version 2.0" in str(caught.value)


def test_newer_minor_of_a_nested_object_is_accepted(pause_end: dict[str, Any]) -> None:
    flavor = data_of(pause_end)["flavor"]
    memory_mb = flavor["nova_object.data"]["memory_mb"]
    flavor["nova_object.version"] = "1.7"
    flavor["nova_object.data"]["new_flavor_field"] = 1
    payload = decode(pause_end).payload
    assert isinstance(payload, InstancePayload) and payload.flavor is not None
    assert payload.flavor.obj_version == "1.7"
    assert payload.flavor.memory_mb == memory_mb
    assert "new_flavor_field" not in payload.flavor.model_dump()["nova_object.data"]


# Bad input --------------------------------------------------------------------------


def test_not_json() -> None:
    with pytest.raises(MalformedNotification, match="not JSON"):
        decode(b"{'event_type': 'instance.create.end'")
    with pytest.raises(MalformedNotification, match="not UTF-8"):
        decode(b"\xff\xfe")


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (b"\xc3\x28", "invalid continuation byte"),  # not a surrogate: orjson said it was
        (b"\xed\xa0\x80", "invalid continuation byte"),  # an encoded surrogate
        (b"\xc0\xaf", "invalid start byte"),  # overlong
        (b"\xe2\x82", "unexpected end of data"),
    ],
)
def test_not_utf8_names_the_problem_and_its_byte(
    pause_end: dict[str, Any], bad: bytes, why: str
) -> None:
    """Found from outside: every body that was not UTF-8 got orjson's "surrogates not
    allowed: line 1 column 1 (char 0)", whatever the bytes were and wherever."""
    text = json.dumps(pause_end).encode()
    at = text.index(b"paused") if b"paused" in text else len(text) // 2
    body = text[:at] + bad + text[at:] if why != "unexpected end of data" else text[:at] + bad
    with pytest.raises(MalformedNotification) as raised:
        decode(body)
    assert str(raised.value).endswith(f"body is not UTF-8: {why} at byte {at} of {len(body)}")


@pytest.mark.parametrize("key", ["nova_object.name", "nova_object.namespace"])
def test_an_object_name_past_the_envelope_bound_is_out_of_range(
    pause_end: dict[str, Any], key: str
) -> None:
    """``limits.ENVELOPE_LENGTH`` bounds the object's name and namespace as it does its
    version (an adversarial probe found the name unbounded: a megabyte of it was read)."""
    at_bound = json.loads(json.dumps(pause_end))
    at_bound["payload"][key] = "X" * 255
    if key == "nova_object.name":
        decode(at_bound)  # an unknown name of Nova's, read by shape
    else:
        with pytest.raises(MalformedNotification, match="is of namespace 'XXX"):
            decode(at_bound)  # within the bound, and no namespace this code reads
    pause_end["payload"][key] = "X" * 256
    with pytest.raises(OutOfRange, match=f"{key} of 256 characters is longer than 255"):
        decode(pause_end)


@pytest.mark.parametrize("missing", ["event_type", "publisher_id", "priority", "payload"])
def test_wrong_envelope_missing_key(pause_end: dict[str, Any], missing: str) -> None:
    del pause_end[missing]
    with pytest.raises(InvalidEnvelope, match=f"lacks {missing}"):
        decode(pause_end)


def test_wrong_envelope_shapes(pause_end: dict[str, Any]) -> None:
    with pytest.raises(InvalidEnvelope, match=r"oslo\.version '1\.0' is not supported"):
        decode({"oslo.version": "1.0", "oslo.message": json.dumps(pause_end)})
    with pytest.raises(InvalidEnvelope, match=r"oslo\.message must be the notification"):
        decode({"oslo.version": "2.0", "oslo.message": pause_end})
    with pytest.raises(InvalidEnvelope, match="JSON object"):
        decode([pause_end])
    with pytest.raises(InvalidEnvelope, match="priority 'LOUD'"):
        decode(pause_end | {"priority": "LOUD"})
    with pytest.raises(InvalidEnvelope, match="timestamp"):
        decode(pause_end | {"timestamp": "yesterday"})


@pytest.mark.parametrize(
    "event_type", ["instance", "instance.pause.finish", "instance..end", "a.b.c.d"]
)
def test_invalid_event_type(pause_end: dict[str, Any], event_type: str) -> None:
    with pytest.raises(InvalidEventType, match="event_type"):
        decode(pause_end | {"event_type": event_type})


def test_wrong_field_type_names_the_field(pause_end: dict[str, Any]) -> None:
    data_of(pause_end)["progress"] = "lots"
    with pytest.raises(MalformedNotification, match="field progress") as caught:
        decode(pause_end)
    assert "InstanceActionPayload 1.9" in str(caught.value)
    assert "'lots'" in str(caught.value)


def test_wrong_nested_field_type_names_the_path(pause_end: dict[str, Any]) -> None:
    data_of(pause_end)["flavor"]["nova_object.data"]["vcpus"] = "one"
    with pytest.raises(MalformedNotification, match=r"field flavor\.vcpus"):
        decode(pause_end)


@pytest.mark.parametrize("how", ["absent", "null"])
def test_missing_uuid(pause_end: dict[str, Any], how: str) -> None:
    if how == "absent":
        del data_of(pause_end)["uuid"]
    else:
        data_of(pause_end)["uuid"] = None
    with pytest.raises(MissingField) as caught:
        decode(pause_end)
    assert caught.value.field == "uuid"
    assert caught.value.reason == "missing_field"


def test_not_a_versioned_object(pause_end: dict[str, Any]) -> None:
    pause_end["payload"] = {"uuid": "178b0921-8f85-4257-88b6-2e743b5a975c"}
    with pytest.raises(MalformedNotification, match="not a versioned object"):
        decode(pause_end)
