"""IP addresses and server tags: the contract takes exactly what Nova could send and
Tempest's server schemas accept, both decode paths decide alike (the compiled one
takes the good ones itself), a bad one is dead-lettered naming it, and a sync's row
fast path hands a bad one to the reference."""

from __future__ import annotations

import copy
import ipaddress
import json
import re
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cellsight.api.render import addresses
from cellsight.indexer.planning import Planned, plan, plan_fast
from cellsight.indexer.row_values import NeedsReference
from cellsight.indexer.row_values import plan as row_plan
from cellsight.notifications import limits
from cellsight.notifications.forms import (
    AS_STORED,
    address_version,
    ip_version,
    is_mac,
    tag_problem,
)
from cellsight.notifications.payloads import InstancePayload, InstanceUpdatePayload, IpPayload
from tests.support import novagen
from tests.support.decoding import reference_planned

jsonschema_validator = pytest.importorskip("tempest.lib.common.jsonschema_validator")
parameter_types = pytest.importorskip(
    "tempest.lib.api_schema.response.compute.v2_1.parameter_types"
)
v2_26 = pytest.importorskip("tempest.lib.api_schema.response.compute.v2_26.servers")
v2_1 = pytest.importorskip("tempest.lib.api_schema.response.compute.v2_1.servers")

CHECKER = jsonschema_validator.FORMAT_CHECKER
VALIDATOR = jsonschema_validator.JSONSCHEMA_VALIDATOR
EVENTS = ["instance.pause.end", "instance.update", "instance.create.end"]
# The detail view's addresses: the base schema with the OS-EXT-IPS attributes.
ADDRESSES_V21 = v2_1.get_server["response_body"]["properties"]["server"]["properties"]["addresses"]


def tempest_reads_as_address(text: str) -> bool:
    return CHECKER.conforms(text, "ipv4") or CHECKER.conforms(text, "ipv6")


def ipaddress_reads(text: str) -> bool:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    return not getattr(address, "scope_id", None)


def _leading_zero(address: ipaddress.IPv4Address) -> str:
    return ".".join(f"0{octet}" for octet in str(address).split("."))


# UUID texts of every form ``uuid.UUID`` reads and Nova never writes, and near misses:
# the tests of the two decode paths and of the exported schema draw from this one.
UUID_TEXTS = st.one_of(
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.uuids().map(lambda u: u.hex),
    st.uuids().map(lambda u: f"{{{u}}}"),
    st.uuids().map(lambda u: u.urn),
    st.uuids().map(lambda u: f"{u}\n"),
    st.text(alphabet="0123456789abcdefgABCDEF-\u0663\uff11 \n{}", min_size=34, max_size=38),
)


IP_TEXTS = st.one_of(
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(str),
    st.ip_addresses(v=6).map(lambda a: a.exploded),
    st.ip_addresses(v=6).map(lambda a: a.exploded.upper()),
    st.ip_addresses(v=4).map(lambda a: f"::ffff:{a}"),
    st.ip_addresses(v=4).map(lambda a: f"1:2:3:4:5:6:{a}"),
    # v=4 draws IPv4Address only; hypothesis types every draw as either version
    cast("st.SearchStrategy[ipaddress.IPv4Address]", st.ip_addresses(v=4)).map(_leading_zero),
    st.ip_addresses().map(lambda a: f"{a}%eth0"),
    st.ip_addresses().map(lambda a: f" {a}"),
    st.ip_addresses().map(lambda a: f"{a}\n"),
    st.ip_addresses(v=4).map(lambda a: str(a).replace("1", "\u0661")),  # Arabic-Indic one
    st.ip_addresses(v=4).map(lambda a: str(a).replace("1", "\uff11")),  # fullwidth one
    st.text(alphabet="0123456789abcdefABCDEF:.%\u0663\uff11 \n\x00", max_size=46),
    st.text(max_size=20),
    st.sampled_from(
        [
            "",
            "::",
            "1::",
            ":::",
            "::1.2.3.4",
            "1.2.3",
            "1.2.3.4.5",
            "256.1.1.1",
            "0.0.0.0",
            "01.2.3.4",
            "1:2:3:4:5:6:7:8",
            "1:2:3:4:5:6:7::",
            "::2:3:4:5:6:7:8",
            "1::2:3:4:5:6:7:8",
            "1:2:3:4:5:6:7:8:9",
            "12345::1",
            "fe80::1%",
            "fe80::1%eth0",
            "::1.2.3.04",
            "1.2.3.4/32",
            "not-an-ip",
            "\ud800",
        ]
    ),
)


@settings(max_examples=600, deadline=None)
@given(text=IP_TEXTS)
def test_an_address_is_what_ipaddress_and_tempest_read_as_one_without_a_scope(text: str) -> None:
    version = ip_version(text)
    assert (version is not None) == ipaddress_reads(text) == tempest_reads_as_address(text)
    if version is not None:
        assert version == ipaddress.ip_address(text).version == address_version(text)


def _body(event_type: str, seed: int, change: Any) -> bytes:
    body = copy.deepcopy(novagen.notification(event_type, seed=seed))
    change(body["payload"]["nova_object.data"])
    return novagen.body(body)


def _decided_alike(raw: bytes, good: bool, names: str) -> Planned | None:
    """Both paths' verdicts on ``raw``: the compiled one takes a good message itself,
    with the reference's document; a bad one is dead-lettered naming ``names``."""
    (outcome,), planned = plan([raw])
    fast = plan_fast(0, raw)
    reference = reference_planned(raw)
    if not good:
        assert outcome is not None and outcome.reason_code in ("malformed", "out_of_range")
        assert fast is None and reference is None and not planned
        assert outcome.reason is not None and names in outcome.reason, outcome.reason
        return None
    assert outcome is None and isinstance(fast, Planned) and reference is not None
    fast_doc, ref_doc = (dict(p.op.document, indexed_at=None) for p in (fast, reference))
    assert fast_doc == ref_doc
    return fast


@settings(max_examples=300, deadline=None)
@given(
    text=IP_TEXTS,
    version=st.sampled_from([4, 6, 99, None]),
    event_type=st.sampled_from(EVENTS),
    seed=st.integers(0, 2**16),
)
def test_addresses_decide_alike_and_what_is_accepted_renders_for_tempest(
    text: str, version: int | None, event_type: str, seed: int
) -> None:
    def change(data: dict[str, Any]) -> None:
        data["ip_addresses"][0]["nova_object.data"].update(address=text, version=version)

    try:
        raw = _body(event_type, seed, change)
    except UnicodeEncodeError:  # a lone surrogate: no producer can send it
        return
    good = ip_version(text) is not None
    planned = _decided_alike(
        raw, good, "ip_addresses.0.address" if "\\u" not in json.dumps(text) else ""
    )
    if planned is None:
        return
    doc = planned.op.document
    shown = addresses(doc)
    assert shown[doc["ip_addresses"][0]["label"]][0] == {
        "version": ipaddress.ip_address(text).version,  # never the payload's own
        "addr": text,
        "OS-EXT-IPS:type": "fixed",
        "OS-EXT-IPS-MAC:mac_addr": doc["ip_addresses"][0]["mac"],
    }
    assert text in doc["ip6" if ":" in text else "ip4"]
    VALIDATOR(parameter_types.addresses, format_checker=CHECKER).validate(shown)


TAGS = st.one_of(
    st.text(min_size=0, max_size=62),
    st.text(alphabet="ab,/é\u00a0\U0001f600", min_size=0, max_size=3),
    st.sampled_from(
        [
            "",
            ",",
            "/",
            "a,b",
            "a/b",
            "t" * 60,
            "t" * 61,
            "é" * 60,
            "é" * 61,
            "\U0001f600" * 60,
            "\U0001f600" * 61,
            " ",
            "\x00",
        ]
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    tags=st.lists(TAGS, max_size=4),
    event_type=st.sampled_from(EVENTS),
    seed=st.integers(0, 2**16),
)
def test_tags_decide_alike_and_what_is_accepted_renders_for_tempest(
    tags: list[str], event_type: str, seed: int
) -> None:
    try:
        raw = _body(event_type, seed, lambda data: data.update(tags=tags))
    except UnicodeEncodeError:
        return
    bad = [t for t in tags if tag_problem(t) is not None]
    planned = _decided_alike(raw, not bad, "field tags" if bad else "")
    if planned is None:
        return
    assert planned.op.document["tags"] == tags
    item_schema = v2_26.tag_items
    VALIDATOR(item_schema, format_checker=CHECKER).validate(tags)


@pytest.mark.parametrize(("count", "good"), [(limits.MAX_TAGS, True), (limits.MAX_TAGS + 1, False)])
def test_a_server_has_at_most_fifty_tags(count: int, good: bool) -> None:
    tags = [f"t{i}" for i in range(count)]
    raw = _body("instance.update", 3, lambda data: data.update(tags=tags))
    _decided_alike(raw, good, "51 tags, the limit is 50" if not good else "")
    assert VALIDATOR(v2_26.tag_items).is_valid(tags) is good


def test_the_reasons_name_the_value() -> None:
    cases = {
        "not-an-ip": ("malformed", "'not-an-ip' is not an IPv4 or IPv6 address"),
        "fe80::1%eth0": ("malformed", "'fe80::1%eth0' is not an IPv4 or IPv6 address"),
    }
    for text, (code, words) in cases.items():
        raw = _body("instance.pause.end", 1, lambda d, t=text: d["ip_addresses"][0][
            "nova_object.data"].update(address=t))  # fmt: skip
        (outcome,), _ = plan([raw])
        assert outcome is not None and outcome.reason is not None
        assert outcome.reason_code == code and words in outcome.reason
    for tag, code, words in [
        ("a,b", "malformed", "tag 'a,b' holds ',', which Nova's tag API refuses"),
        ("a/b", "malformed", "tag 'a/b' holds '/', which"),
        ("a/,b", "malformed", "tag 'a/,b' holds ',' and '/', which"),
        ("", "out_of_range", "tag '' has 0 characters, a tag has 1 to 60"),
        ("t" * 61, "out_of_range", "has 61 characters, a tag has 1 to 60"),
    ]:
        raw = _body("instance.update", 1, lambda d, t=tag: d.update(tags=[t]))
        (outcome,), _ = plan([raw])
        assert outcome is not None and outcome.reason is not None
        assert outcome.reason_code == code and words in outcome.reason


def test_a_cells_row_is_read_as_it_is_stored_past_these_rules() -> None:
    """A sync indexes a row as its cell holds it (README, Limits): the row fast path
    passes addresses, MACs and tags as text, and the reference, read with ``AS_STORED``
    (as ``cells.rows`` reads rows), takes them; a notification never does."""
    ip = row_plan(IpPayload.model_fields["address"].annotation)
    mac = row_plan(IpPayload.model_fields["mac"].annotation)
    for bad in ("not-an-ip", "fe80::1%eth0", ""):
        assert ip.convert(bad) == bad and mac.convert(bad) == bad
    with pytest.raises(NeedsReference):
        ip.convert(4)  # not text at all: the reference decides
    for field in (InstancePayload.model_fields["tags"], InstanceUpdatePayload.model_fields["tags"]):
        tags = row_plan(field.annotation, field.metadata)
        for odd in (["a,b"], ["a/b"], [""], ["t" * 61], ["t"] * 51):
            assert tags.convert(odd) == odd
        with pytest.raises(NeedsReference):
            tags.convert([1])
    data = {"address": "not-an-ip", "mac": "fa:16:3e"}
    stored = IpPayload.model_validate(data, context={AS_STORED: True})
    assert (stored.address, stored.mac) == ("not-an-ip", "fa:16:3e")
    with pytest.raises(ValidationError):
        IpPayload.model_validate(data)
    update = {"uuid": "7d3c1a2b-0e9f-4d8c-b7a6-5e4f3d2c1b0a", "tags": ["a,b"] * 60}
    assert InstanceUpdatePayload.model_validate(update, context={AS_STORED: True}).tags
    with pytest.raises(ValidationError):
        InstanceUpdatePayload.model_validate(update)


MAC_TEXTS = st.one_of(
    st.binary(min_size=6, max_size=6).map(lambda b: b.hex(":")),
    st.binary(min_size=6, max_size=6).map(lambda b: b.hex(":").upper()),
    st.binary(min_size=6, max_size=6).map(lambda b: b.hex("-")),
    st.binary(min_size=6, max_size=6).map(lambda b: b.hex()),
    st.binary(min_size=6, max_size=6).map(lambda b: b.hex(":").replace("a", " ")),
    st.binary(min_size=6, max_size=6).map(lambda b: b.hex(":").replace("1", "\u0661")),
    st.text(alphabet="0123456789abcdefABCDEFg: -\u0663\n", min_size=15, max_size=19),
    st.sampled_from(["", "fa:16:3e:00:00:0", "fa:16:3e:00:00:000", "fa:16:3e:00:00:0g"]),
)
MAC_PATTERN = re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}")


@settings(max_examples=300, deadline=None)
@given(
    text=MAC_TEXTS,
    event_type=st.sampled_from(EVENTS),
    seed=st.integers(0, 2**16),
)
def test_macs_decide_alike_and_what_is_accepted_renders_for_tempest(
    text: str, event_type: str, seed: int
) -> None:
    """A MAC is six hex pairs joined by ':' (oslo's MACAddress field's form, which
    Tempest's pattern allows); another is dead-lettered naming it, on both paths."""
    good = is_mac(text)
    assert good == bool(MAC_PATTERN.fullmatch(text))

    def change(data: dict[str, Any]) -> None:
        data["ip_addresses"][0]["nova_object.data"].update(mac=text)

    planned = _decided_alike(_body(event_type, seed, change), good, "ip_addresses.0.mac")
    if planned is None:
        return
    doc = planned.op.document
    shown = addresses(doc)
    VALIDATOR(ADDRESSES_V21, format_checker=CHECKER).validate(shown)
    assert shown[doc["ip_addresses"][0]["label"]][0]["OS-EXT-IPS-MAC:mac_addr"] == text


def test_no_mac_and_an_odd_address_kind_render_for_tempest() -> None:
    """Nova never leaves a MAC out; a notification may, and then none is shown (null
    would fail Tempest's schema). Nova's address kinds are fixed and floating."""
    doc = {
        "ip_addresses": [
            {"address": "10.0.0.1", "label": "private", "mac": None, "meta": {"type": "odd"}},
            {"address": "fd00::1", "label": "private", "meta": {"type": "floating"}},
        ]
    }
    shown = addresses(doc)
    assert shown == {
        "private": [
            {"version": 4, "addr": "10.0.0.1", "OS-EXT-IPS:type": "fixed"},
            {"version": 6, "addr": "fd00::1", "OS-EXT-IPS:type": "floating"},
        ]
    }
    VALIDATOR(ADDRESSES_V21, format_checker=CHECKER).validate(shown)
