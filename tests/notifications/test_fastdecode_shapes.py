"""The compiled decoder on Nova's other instance classes, read by shape, and on the
versions of objects: it decides as the reference decoder does, or declines and leaves
the reference's verdict to stand.

A class read by shape takes the compiled path with the reference's plan, and the
shape's fields decide alike on both paths; a nested object's version outside the
minors it reads, a version of other digits and ever-new minor versions get the
reference's verdict (the latter without growing memory or the log)."""

from __future__ import annotations

import json
import logging
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellsight.indexer.outcomes import Outcome, Verdict
from cellsight.indexer.planning import Planned, plan, plan_fast
from cellsight.notifications import base, fastdecode
from cellsight.notifications.fastdecode import decode_fast
from cellsight.notifications.payloads import NOVA_INSTANCE_SUBCLASSES, InstancePayload
from tests.support import novagen
from tests.support.decoding import dead_reason_code, reference_plan, same_plan, same_verdict


def _by_shape(name: str, seed: int = 5) -> dict[str, Any]:
    body = novagen.notification("instance.exists", seed=seed)
    body["payload"]["nova_object.name"] = name
    return body


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
    same_plan(fast, reference_plan(raw))
    assert decode_fast(raw).obj_name == name


def test_any_major_version_is_read_by_shape_as_the_registry_does() -> None:
    body = _by_shape("InstanceExistsPayload")
    body["payload"]["nova_object.version"] = "7.3"
    raw = novagen.body(body)
    fast = plan_fast(0, raw)
    assert isinstance(fast, Planned)
    same_plan(fast, reference_plan(raw))
    body["payload"]["nova_object.version"] = "7"
    assert plan_fast(0, novagen.body(body)) is None  # the reference names the error
    assert dead_reason_code(reference_plan(novagen.body(body))) == "malformed"


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
    same_verdict(planned[0] if planned else outcomes[0], reference_plan(raw))


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
        assert not planned and dead_reason_code(reference_plan(raw.encode())) == "malformed"
        same_verdict(outcomes[0], reference_plan(raw.encode()))


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
        same_plan(fast, reference)
    if not shaped:
        assert fast is None
        assert dead_reason_code(reference) == "not_an_instance"
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
        assert dead_reason_code(reference_plan(raw)) == "malformed"
    assert isinstance(plan_fast(0, memoryview(wrapped)), Planned)


def test_an_empty_cell_uuid_is_no_cell_on_both_paths() -> None:
    for event_type in ("instance.exists", "instance.pause.end"):
        body = novagen.notification(event_type, seed=5)
        body["payload"]["nova_object.data"]["cell_uuid"] = ""
        raw = novagen.body(body)
        fast = plan_fast(0, raw)
        assert isinstance(fast, Planned) and fast.op.document["cell_uuid"] is None
        same_plan(fast, reference_plan(raw))


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
