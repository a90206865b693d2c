"""Bad messages land in the dead-letter queue with their reason; good ones around them
are indexed; an operator can list and replay them."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from kombu import Producer
from typer.testing import CliRunner

from cellsight.cli import app
from cellsight.cli.groups import register
from cellsight.clients import build_bus
from cellsight.indexer.dlq import peek
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.notifications import queues
from tests.support.indexing import bus_settings, running_indexer, wait_for

register(app)


def _sample(nova_like_dir: Path, name: str) -> dict[str, Any]:
    return json.loads((nova_like_dir / f"{name}.json").read_text())


def _bad_bodies(nova_like_dir: Path) -> dict[str, bytes]:
    good = _sample(nova_like_dir, "instance-pause-end")

    def variant(change: Any) -> bytes:
        body = copy.deepcopy(good)
        change(body)
        return json.dumps(body).encode()

    def data(body: dict[str, Any]) -> dict[str, Any]:
        return body["payload"]["nova_object.data"]

    service = _sample(nova_like_dir, "service-update")
    service["event_type"] = "instance.pause.end"
    return {
        "malformed": b"{this is not json",
        "not_utf8": b"\xff\xfe\xfa",
        "not_an_object": b"[1, 2, 3]",
        "invalid_envelope": variant(lambda b: b.pop("payload")),
        "oslo_version": json.dumps(
            {"oslo.version": "1.0", "oslo.message": json.dumps(good)}
        ).encode(),
        "oslo_message": json.dumps({"oslo.version": "2.0", "oslo.message": {"a": 1}}).encode(),
        "unknown_major_version": variant(
            lambda b: b["payload"].update({"nova_object.version": "2.0"})
        ),
        "invalid_event_type": variant(lambda b: b.update(event_type="instance")),
        "wrong_field_type": variant(lambda b: data(b).update(locked="maybe")),
        "missing_uuid": variant(lambda b: data(b).pop("uuid")),
        "not_an_instance": json.dumps(service).encode(),
        "bad_priority": variant(lambda b: b.update(priority="LOUD")),
    }


EXPECTED_CODES = {
    "malformed": "malformed",
    "not_utf8": "malformed",
    "not_an_object": "invalid_envelope",
    "invalid_envelope": "invalid_envelope",
    "oslo_version": "invalid_envelope",
    "oslo_message": "invalid_envelope",
    "unknown_major_version": "unknown_major_version",
    "invalid_event_type": "invalid_event_type",
    "wrong_field_type": "malformed",
    "missing_uuid": "missing_field",
    "not_an_instance": "not_an_instance",
    "bad_priority": "invalid_envelope",
}


def test_bad_messages_are_dead_lettered_with_reasons_between_good_ones(
    bus: str, nova_like_dir: Path, tmp_path: Path
) -> None:
    settings = bus_settings(tmp_path / "data", bus)
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    bad = _bad_bodies(nova_like_dir)
    good_uuids = []
    with build_bus(settings) as b, b.connection() as conn:
        producer = Producer(conn.channel())
        exchange = queues.notifications_exchange(settings.exchange)
        queues.indexer_queue(settings.indexer_queue, exchange)(conn.channel()).declare()
        for i, (kind, body) in enumerate(bad.items()):
            good = _sample(nova_like_dir, "instance-power_on-end")
            good["payload"]["nova_object.data"]["uuid"] = f"00000000-0000-4000-8000-{i:012d}"
            good_uuids.append(good["payload"]["nova_object.data"]["uuid"])
            for raw in (json.dumps(good).encode(), body):
                producer.publish(
                    raw,
                    exchange=exchange,
                    routing_key="versioned_notifications.info",
                    content_type="application/json",
                    content_encoding="binary",
                    headers={"x-test-kind": kind},
                    delivery_mode=2,
                    # A dead letter keeps it, for tracing (an adversarial probe: None).
                    message_id=f"id-{kind}" if raw is body else None,
                )
    total = 2 * len(bad)
    with running_indexer(settings, engine) as consumer:
        wait_for(lambda: sum(consumer.totals.values()) >= total, what="all messages")
    assert consumer.totals["dead"] == len(bad) >= 8
    assert consumer.totals["indexed"] == len(bad)
    assert all(engine.get("instance", u) is not None for u in good_uuids)

    with build_bus(settings) as b, b.connection() as conn:
        letters = list(peek(conn, settings.dead_letter_exchange, settings.dead_letter_queue, 100))
        again = list(peek(conn, settings.dead_letter_exchange, settings.dead_letter_queue, 100))
    assert len(letters) == len(again) == len(bad)  # peeking removes nothing
    by_body = {letter.body: letter for letter in letters}
    for kind, body in bad.items():
        letter = by_body[body]  # the original bytes, unchanged
        assert letter.reason_code == EXPECTED_CODES[kind], (kind, letter.reason)
        assert letter.reason, kind
        assert letter.routing_key == "versioned_notifications.info"
        assert letter.message_id == f"id-{kind}", kind
    missing = by_body[bad["missing_uuid"]]
    assert "uuid" in missing.reason
    major = by_body[bad["unknown_major_version"]]
    assert "InstanceActionPayload" in major.reason and "2.0" in major.reason

    runner = CliRunner()
    env = _env(settings)
    listed = runner.invoke(
        app, ["--data-dir", str(settings.data_dir), "dlq", "list", "--json"], env=env
    )
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.output.splitlines() if line.startswith("{")]
    assert sorted(r["reason_code"] for r in rows) == sorted(EXPECTED_CODES.values())
    assert sorted(r["message_id"] for r in rows) == sorted(f"id-{kind}" for kind in bad)

    # Replay re-drives them through the indexer: still bad, so they come back with their
    # reasons; nothing is lost on the way.
    replayed = runner.invoke(
        app,
        ["--data-dir", str(settings.data_dir), "dlq", "replay", "--reason", "missing_field"],
        env=env,
    )
    assert replayed.exit_code == 0, replayed.output
    assert "replayed 1" in replayed.output
    with running_indexer(settings, engine) as consumer:
        wait_for(lambda: consumer.totals["dead"] >= 1, what="replayed letter")
    with build_bus(settings) as b, b.connection() as conn:
        after = list(peek(conn, settings.dead_letter_exchange, settings.dead_letter_queue, 100))
    assert len(after) == len(bad)
    assert {a.message_id for a in after} == {f"id-{kind}" for kind in bad}  # replayed too
    engine.close()


def _env(settings: Any) -> dict[str, str]:
    env = {
        "CELLSIGHT_EXCHANGE": settings.exchange,
        "CELLSIGHT_INDEXER_QUEUE": settings.indexer_queue,
        "CELLSIGHT_DEAD_LETTER_EXCHANGE": settings.dead_letter_exchange,
        "CELLSIGHT_DEAD_LETTER_QUEUE": settings.dead_letter_queue,
    }
    if settings.bus_url:
        env["CELLSIGHT_BUS_URL"] = settings.bus_url
    return env


def test_a_replay_of_an_empty_queue_replays_nothing(bus: str, tmp_path: Path) -> None:
    """On Redis an empty queue has no key, and the passive declare that counted its
    letters was a 404: ``dlq replay`` exited 1 on a new data directory and once every
    letter had been replayed (an operator's walk through the README)."""
    settings = bus_settings(tmp_path / "data", bus)
    settings.data_dir.mkdir()
    for args in (["dlq", "replay"], ["dlq", "replay", "--reason", "malformed"]):
        result = CliRunner().invoke(
            app, ["--data-dir", str(settings.data_dir), *args], env=_env(settings)
        )
        assert result.exit_code == 0, result.output
        assert "replayed 0" in result.output


def test_dlq_list_prints_a_letters_text_as_it_came(tmp_path: Path) -> None:
    """A letter's reason quotes the producer's text, which may read as Rich markup: once
    ``dlq list`` stopped at such a letter (``MarkupError``), showing none of them."""
    settings = bus_settings(tmp_path / "data", "embedded")
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    body = {"event_type": ["[/]"], "publisher_id": "[bold]x", "priority": "INFO", "payload": {}}
    with build_bus(settings) as b, b.connection() as conn:
        exchange = queues.notifications_exchange(settings.exchange)
        queues.indexer_queue(settings.indexer_queue, exchange)(conn.channel()).declare()
        Producer(conn.channel()).publish(
            json.dumps(body).encode(),
            exchange=exchange,
            routing_key="versioned_notifications.info",
            content_type="application/json",
            content_encoding="utf-8",
        )
    with running_indexer(settings, engine) as consumer:
        wait_for(lambda: consumer.totals["dead"] == 1, what="the dead letter")
    listed = CliRunner().invoke(
        app, ["--data-dir", str(settings.data_dir), "dlq", "list"], env=_env(settings)
    )
    assert listed.exit_code == 0, listed.output
    assert "[/]" in listed.output and "1 dead letter(s) shown" in listed.output
    engine.close()
