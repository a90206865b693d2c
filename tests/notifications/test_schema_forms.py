"""The exported JSON Schema (``cellsight notifications schema``) and the contract agree
on addresses, MACs, tags and UUIDs: a standard validator, formats checked, accepts a
payload exactly when the indexer does not dead-letter it."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from cellsight.indexer.planning import plan
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
    assert indexed or outcome.reason_code in ("malformed", "out_of_range"), outcome
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
