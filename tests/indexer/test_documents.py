"""Payload → document and the version rule, called directly (pure functions)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cellsight.indexer.documents import (
    TIE_BITS,
    event_version,
    instance_document,
    snapshot_time,
    version_of,
)
from cellsight.indexer.fields import INSTANCE_FIELDS, Kind, search_mapping
from cellsight.indexer.writer import Planned, Verdict, merge_tags, plan
from cellsight.notifications.base import format_timestamp
from cellsight.notifications.envelope import EventType, decode
from cellsight.notifications.payloads import InstancePayload


def load(nova_like_dir: Path, name: str) -> dict[str, Any]:
    return json.loads((nova_like_dir / f"{name}.json").read_text())


def test_every_sample_maps_to_a_document_with_only_registry_fields(nova_like_dir: Path) -> None:
    names = {f.name for f in INSTANCE_FIELDS}
    seen = 0
    for path in sorted(nova_like_dir.glob("instance-*.json")):
        n = decode(path.read_text())
        assert isinstance(n.payload, InstancePayload)
        doc = instance_document(n.payload, n.event_type, 1)
        assert set(doc) <= names, set(doc) - names
        assert doc["uuid"] == n.payload.uuid
        assert doc["tenant_id"] == n.payload.tenant_id
        assert doc["flavor_name"] == n.payload.flavor.name if n.payload.flavor else True
        seen += 1
    assert seen == 14


def test_delete_end_is_a_tombstone_and_delete_start_is_not(nova_like_dir: Path) -> None:
    start = decode(load(nova_like_dir, "instance-delete-start"))
    end = decode(load(nova_like_dir, "instance-delete-end"))
    assert isinstance(start.payload, InstancePayload) and isinstance(end.payload, InstancePayload)
    d_start = instance_document(start.payload, start.event_type, 1)
    d_end = instance_document(end.payload, end.event_type, 2)
    assert d_start["deleted"] is False
    assert d_end["deleted"] is True and d_end["state"] == "deleted"
    assert end.payload.deleted_at is not None
    assert d_end["deleted_at"] == format_timestamp(end.payload.deleted_at)
    assert end.payload.updated_at == start.payload.updated_at
    # Same updated_at: the phase breaks the tie so the delete wins.
    assert event_version(end.payload, end.event, None) > event_version(
        start.payload, start.event, None
    )


def test_ips_are_split_by_family_and_tags_absent_when_payload_lacks_them(
    nova_like_dir: Path,
) -> None:
    n = decode(load(nova_like_dir, "instance-pause-end"))
    assert isinstance(n.payload, InstancePayload)
    doc = instance_document(n.payload, n.event_type, 1)
    by_family = {ip.version: [ip.address] for ip in n.payload.ip_addresses}
    assert doc["ip4"] == by_family[4] and doc["ip6"] == by_family[6]
    assert all(":" in a for a in doc["ip6"]) and not any(":" in a for a in doc["ip4"])
    assert "tags" not in doc  # Nova's action payloads carry no tags: keep the stored ones
    create = decode(load(nova_like_dir, "instance-create-end"))
    assert isinstance(create.payload, InstancePayload)
    assert instance_document(create.payload, create.event_type, 1)["tags"] == ["tag"]


def _payload(**changes: Any) -> InstancePayload:
    base: dict[str, Any] = {"uuid": "178b0921-8f85-4257-88b6-2e743b5a975c"}
    base.update(changes)
    return InstancePayload.model_validate(base)


def test_revision_is_the_version_when_the_producer_sends_one() -> None:
    p = _payload(revision=42, updated_at=datetime(2030, 1, 1, tzinfo=UTC))
    assert event_version(p, EventType.parse("instance.update"), None) == 42


def test_time_version_uses_microseconds_then_phase_then_emission() -> None:
    t = datetime(2026, 11, 21, 12, 0, 0, 1, tzinfo=UTC)
    later = _payload(updated_at=t + timedelta(microseconds=1))
    now = _payload(updated_at=t)
    upd, end, start = (
        EventType.parse(e)
        for e in ("instance.update", "instance.power_off.end", "instance.power_off.start")
    )
    assert event_version(later, start, None) > event_version(now, end, None)  # µs precision
    assert (
        event_version(now, end, None)
        > event_version(now, upd, None)
        > event_version(now, start, None)
    )
    v1 = event_version(now, upd, t + timedelta(milliseconds=3))
    v2 = event_version(now, upd, t + timedelta(milliseconds=7))
    assert v2 > v1
    # Emission far after the snapshot is capped inside the tie bits, never overflows.
    capped = event_version(now, upd, t + timedelta(days=3))
    assert capped >> TIE_BITS == event_version(now, upd, None) >> TIE_BITS


def test_time_versions_fit_a_signed_64_bit_long_until_2255() -> None:
    far = _payload(updated_at=datetime(2255, 1, 1, tzinfo=UTC))
    assert event_version(far, EventType.parse("instance.delete.end"), None) < 2**63


def test_snapshot_time_falls_back_to_created_at(nova_like_dir: Path) -> None:
    n = decode(load(nova_like_dir, "instance-create-start"))
    assert isinstance(n.payload, InstancePayload)
    assert n.payload.updated_at is None
    assert snapshot_time(n.payload) == n.payload.created_at


def test_mapping_is_strict_and_typed_from_the_payload_schema() -> None:
    mapping = search_mapping("instance")
    assert mapping["dynamic"] == "strict"
    props = mapping["properties"]
    assert props["created_at"]["type"] == "date_nanos"  # microseconds must not tie
    assert props["locked"]["type"] == "boolean"
    assert props["progress"]["type"] == "long"
    assert props["display_name"]["type"] == "text" and "raw" in props["display_name"]["fields"]
    assert props["ip_addresses"] == {"type": "object", "enabled": False}
    assert {f.name for f in INSTANCE_FIELDS if f.kind is Kind.DATE} >= {
        "created_at",
        "updated_at",
        "launched_at",
        "terminated_at",
        "deleted_at",
    }


def test_plan_classifies_bad_messages_without_touching_an_engine(nova_like_dir: Path) -> None:
    good = load(nova_like_dir, "instance-power_on-end")
    service = load(nova_like_dir, "service-update")
    not_instance = json.loads(json.dumps(service))
    not_instance["event_type"] = "instance.power_on.end"
    outcomes, planned = plan([b"{nope", json.dumps(good), service, not_instance])
    assert outcomes[0] is not None and outcomes[0].verdict is Verdict.DEAD
    assert outcomes[0].reason_code == "malformed"
    assert outcomes[1] is None and planned[0].position == 1
    assert outcomes[2] is not None and outcomes[2].verdict is Verdict.IGNORED
    assert outcomes[3] is not None and outcomes[3].reason_code == "not_an_instance"
    assert "ServiceStatusPayload" in (outcomes[3].reason or "")


def test_merge_tags_takes_the_newest_known_tags_below_the_event(nova_like_dir: Path) -> None:
    create = load(nova_like_dir, "instance-create-end")
    pause = load(nova_like_dir, "instance-pause-end")
    create["payload"]["nova_object.data"]["tags"] = ["a", "b"]
    _, planned = plan([create, pause])
    tagged, untagged = planned
    assert "tags" not in untagged.op.document
    merge_tags(planned, {})
    assert untagged.op.document["tags"] == ["a", "b"]
    assert tagged.op.document["tags"] == ["a", "b"]


@pytest.mark.parametrize("event_type", ["instance.create", "instance.resize.end"])
def test_unknown_instance_event_types_still_map(nova_like_dir: Path, event_type: str) -> None:
    body = load(nova_like_dir, "instance-pause-end")
    body["event_type"] = event_type
    body["payload"]["nova_object.name"] = "InstanceActionSomethingNewPayload"
    outcomes, planned = plan([body])
    assert outcomes == [None]
    p: Planned = planned[0]
    assert p.op.resource == "instance" and p.op.document["event_type"] == event_type


def test_writer_counts_indexed_and_stale_per_resource(nova_like_dir: Path, tmp_path: Path) -> None:
    from cellsight.indexer import metrics
    from cellsight.indexer.engines.embedded import EmbeddedEngine
    from cellsight.indexer.writer import BatchWriter

    def count(counter: Any) -> float:
        return float(counter.labels("instance")._value.get())

    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    body = json.dumps(load(nova_like_dir, "instance-power_on-end"))
    indexed, stale = count(metrics.INDEXED), count(metrics.STALE)
    BatchWriter(engine).write([body, body])  # the duplicate is stale
    engine.close()
    assert count(metrics.INDEXED) == indexed + 1
    assert count(metrics.STALE) == stale + 1


def test_snapshots_before_1970_count_from_1970_ordered_by_phase() -> None:
    """README, the version rule: versions are never negative (engines refuse them), so
    a snapshot before 1970 gets 1970's time; the phase still orders its events."""
    start, end = EventType.parse("instance.pause.start"), EventType.parse("instance.pause.end")
    old = datetime(1960, 5, 1, tzinfo=UTC)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert version_of(None, old, end, None) == version_of(None, epoch, end, None) >= 0
    assert version_of(None, old, start, None) < version_of(None, old, end, None)
    assert version_of(None, None, end, None) == version_of(None, epoch, end, None)
    later = epoch + timedelta(microseconds=1)
    assert version_of(None, later, start, None) > version_of(None, old, end, None)


@pytest.mark.parametrize("name", ["FlavorPayload", "IpPayload", "KeypairPayload"])
def test_a_known_other_class_on_an_instance_event_is_named_not_called_fieldless(
    nova_like_dir: Path, name: str
) -> None:
    """Found from outside: an instance's whole payload under the name of another class
    of Nova's was dead-lettered as "does not carry the InstancePayload fields", which
    it did. A known name is read as that class (README: only an unknown one is read by
    shape); the reason now says so."""
    body = load(nova_like_dir, "instance-pause-end")
    body["payload"]["nova_object.name"] = name
    outcomes, planned = plan([body])
    assert not planned
    (outcome,) = outcomes
    assert outcome is not None and outcome.reason_code == "not_an_instance"
    assert f"payload {name} " in (outcome.reason or "")
    assert "names a class of Nova's that is not an instance snapshot" in (outcome.reason or "")


def test_ignored_event_types_are_counted_under_a_bounded_set_of_labels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An adversarial probe: 20,000 made-up ``service.*`` event types became 20,000
    series of ``_ignored_total`` (12 MB of /metrics, the process growing with them)."""
    from cellsight.indexer import metrics
    from cellsight.indexer.writer import record_outcomes
    from tests.support import novagen

    monkeypatch.setattr(metrics, "_ignored_labels", set())

    def series() -> dict[str, float]:
        (family,) = [m for m in metrics.REGISTRY.collect() if m.name == "cellsight_indexer_ignored"]
        return {
            s.labels["event_type"]: s.value for s in family.samples if s.name.endswith("_total")
        }

    before = series()
    bodies = []
    # Made-up types first, then Nova's own: those still get their label.
    nova = ["service.update", "aggregate.create.end", "compute.exception"]
    event_types = [f"service.probe{i:06d}" for i in range(metrics.IGNORED_EVENT_TYPES + 300)]
    for i, event_type in enumerate(event_types + nova):
        body = novagen.notification("instance.update", seed=i)
        body["event_type"] = event_type
        body["payload"] = {
            "nova_object.name": "ServiceStatusPayload",
            "nova_object.namespace": "nova",
            "nova_object.version": "1.1",
            "nova_object.data": {},
        }
        bodies.append(json.dumps(body).encode())
    outcomes, planned = plan(bodies)
    assert not planned and all(o is not None and o.verdict is Verdict.IGNORED for o in outcomes)
    record_outcomes([o for o in outcomes if o is not None])
    after = series()
    grown = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
    # The first made-up ones, "other", and Nova's own.
    assert len(grown) == metrics.IGNORED_EVENT_TYPES + 1 + len(nova)
    assert grown[metrics.OTHER] == 300
    assert grown["service.probe000000"] == 1
    assert all(grown[t] == 1 for t in nova)
    assert sum(grown.values()) == len(bodies)  # every one counted
