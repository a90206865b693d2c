"""``cellsight notifications schema | validate | publish``."""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from typer.testing import CliRunner, Result

from cellsight.cli import app
from cellsight.cli.groups import register
from cellsight.notifications import queues
from cellsight.notifications.bus import open_bus
from cellsight.notifications.envelope import decode
from tests.support import novagen

Invoke = Callable[..., Result]


@pytest.fixture(scope="module")
def cli() -> Invoke:
    if not any(group.name == "notifications" for group in app.registered_groups):
        register(app)
    runner = CliRunner()

    def invoke(*args: str | Path, env: dict[str, str] | None = None) -> Result:
        return runner.invoke(app, [str(a) for a in args], env=env)

    return invoke


def one_line(text: str) -> str:
    return " ".join(text.split())


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def pause_end(nova_like_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((nova_like_dir / "instance-pause-end.json").read_text())
    return data


# validate ---------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["nova", "generated"])
def test_validate_every_sample(cli: Invoke, which: str, request: pytest.FixtureRequest) -> None:
    """Conformance with Nova's own samples, and the generated ones."""
    fixture = "nova_sample_paths" if which == "nova" else "sample_paths"
    sample_paths = request.getfixturevalue(fixture)
    result = cli("notifications", "validate", *sample_paths)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == len(sample_paths)
    for path, line in zip(sample_paths, lines, strict=True):
        notification = decode(path.read_bytes())
        payload = notification.payload
        assert line == (
            f"ok   {path}: {notification.event_type} {payload.obj_name} {payload.obj_version}"
        )
    assert any(line.endswith("instance.pause.end InstanceActionPayload 1.9") for line in lines)
    assert any(line.endswith("service.update ServiceStatusPayload 1.1") for line in lines)


def test_validate_accepts_the_oslo_wrapper(cli: Invoke, tmp_path: Path, pause_end: dict) -> None:
    wrapped = {"oslo.version": "2.0", "oslo.message": json.dumps(pause_end)}
    result = cli("notifications", "validate", write_json(tmp_path / "wrapped.json", wrapped))
    assert result.exit_code == 0, result.output
    assert "instance.pause.end InstanceActionPayload 1.9" in result.stdout


@pytest.mark.parametrize(
    ("name", "content", "error"),
    [
        ("truncated.json", '{"event_type": "instance.create.end",', "MalformedNotification"),
        (
            "no-payload.json",
            {"event_type": "instance.create.end", "priority": "INFO", "publisher_id": "x"},
            "InvalidEnvelope: notification lacks payload",
        ),
        ("old-oslo.json", {"oslo.version": "1.0", "oslo.message": "{}"}, "InvalidEnvelope"),
    ],
)
def test_validate_names_the_error(
    cli: Invoke, tmp_path: Path, name: str, content: Any, error: str
) -> None:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    result = cli("notifications", "validate", path)
    assert result.exit_code == 1
    assert f"FAIL {path}: {error}" in one_line(result.stderr)
    assert "1 of 1 files failed validation" in result.stderr
    assert "Traceback" not in result.output


def test_validate_unknown_major_version(cli: Invoke, tmp_path: Path, pause_end: dict) -> None:
    pause_end["payload"]["nova_object.version"] = "2.0"
    path = write_json(tmp_path / "v2.json", pause_end)
    result = cli("notifications", "validate", path)
    assert result.exit_code == 1
    assert (
        f"FAIL {path}: UnknownMajorVersion: payload: InstanceActionPayload version 2.0"
        in one_line(result.stderr)
    )


def test_validate_reports_every_file(cli: Invoke, tmp_path: Path, sample_paths: list[Path]) -> None:
    missing = tmp_path / "missing.json"
    result = cli("notifications", "validate", sample_paths[0], missing, sample_paths[1])
    assert result.exit_code == 1
    assert result.stdout.count("ok   ") == 2
    assert f"FAIL {missing}: cannot read: No such file or directory" in one_line(result.stderr)
    assert "1 of 3 files failed validation" in result.stderr


# schema -----------------------------------------------------------------------------


def schema_errors(schema: dict, value: Any) -> list[str]:
    """What a standard JSON Schema validator (draft 2020-12) finds, asked to check the
    formats it knows (ipv4 and ipv6 always; date-time only with rfc3339-validator, which
    the test extras do not install)."""
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(value)]


def test_schema_writes_one_valid_file_per_class(
    cli: Invoke, tmp_path: Path, sample_paths: list[Path], pause_end: dict
) -> None:
    out = tmp_path / "schemas"
    result = cli("notifications", "schema", "--out", out)
    assert result.exit_code == 0, result.output
    files = {path.name: json.loads(path.read_text()) for path in out.glob("*.json")}
    assert {
        "InstanceActionPayload-1.9.json",
        "InstanceCreatePayload-1.13.json",
        "InstanceUpdatePayload-2.1.json",
        "FlavorPayload-1.4.json",
        "ComputeNodePayload-1.0.json",
        "Selection-1.1.json",
    } <= set(files)
    assert f"wrote {len(files)} schema files to {out}" in result.stdout
    for name, schema in files.items():
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["$id"] == name
        assert schema["required"] == sorted(schema["properties"])

    checked = 0
    for path in sample_paths:
        payload = json.loads(path.read_text())["payload"]
        schema = files.get(f"{payload['nova_object.name']}-{payload['nova_object.version']}.json")
        if schema is not None:
            assert schema_errors(schema, payload) == [], path.name
            checked += 1
    assert checked == 14  # every instance.* sample; service.update has no schema here

    schema = files["InstanceActionPayload-1.9.json"]
    bad = copy.deepcopy(pause_end["payload"])
    bad["nova_object.version"] = "2.0"
    bad["nova_object.data"]["progress"] = "lots"
    bad["nova_object.data"]["flavor"]["nova_object.data"]["vcpus"] = "one"
    del bad["nova_object.data"]["uuid"]
    errors = " | ".join(schema_errors(schema, bad))
    for fragment in ("nova_object.version", "progress", "flavor", "'uuid' is a required"):
        assert fragment in errors


def test_schema_unwritable_out_dir(cli: Invoke, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = cli("notifications", "schema", "--out", blocker / "sub")
    assert result.exit_code == 2
    assert f"--out {blocker / 'sub'}" in one_line(result.stderr)
    assert "Traceback" not in result.output


# publish ----------------------------------------------------------------------------


def test_publish_onto_the_embedded_bus(
    cli: Invoke, tmp_path: Path, sample_paths: list[Path], drain: Callable[..., list]
) -> None:
    data_dir = tmp_path / "data"
    files = sample_paths[:3]
    result = cli("--data-dir", data_dir, "notifications", "publish", *files)
    assert result.exit_code == 0, result.output
    assert "published 3 notifications to exchange 'nova' on redis+socket://" in result.stdout

    # The CLI process is gone; the indexer queue it declared kept the messages.
    with open_bus(None, data_dir / "bus", timeout=5) as bus, bus.connection() as connection:
        received = drain(connection, queues.indexer_queue(), 3)
    assert [
        decode(body).to_dict() | {"message_id": None, "timestamp": None} for _, body in received
    ] == [json.loads(f.read_text()) | {"message_id": None, "timestamp": None} for f in files]
    assert all(decode(body).message_id for _, body in received)


def test_publish_validates_every_file_first(
    cli: Invoke, tmp_path: Path, sample_paths: list[Path]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    result = cli("--data-dir", tmp_path / "data", "notifications", "publish", sample_paths[0], bad)
    assert result.exit_code == 2
    assert f"{bad}: MalformedNotification" in one_line(result.stderr)
    assert "nothing published" in one_line(result.stderr)
    assert not (tmp_path / "data" / "bus").exists()  # the bus was never opened


def test_publish_to_a_dead_broker_fails_cleanly(
    cli: Invoke, tmp_path: Path, sample_paths: list[Path]
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        "CELLSIGHT_BUS_URL": f"amqp://guest:guest@127.0.0.1:{port}//",
        "CELLSIGHT_PUBLISH_TIMEOUT": "1",
    }
    result = cli(
        "--data-dir", tmp_path / "data", "notifications", "publish", sample_paths[0], env=env
    )
    assert result.exit_code == 1  # runtime: the bus failed (cellsight.cli.errors)
    assert "not delivered to exchange 'nova'" in one_line(result.stderr)
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("event_type", "namespace", "says"),
    [
        (
            "compute_node.update",
            "nova",
            "the indexer would dead-letter it: compute_node.update: payload nova.Selection"
            " 1.1 is not a cellsight.",
        ),
        (
            "instance.update",
            "nova",
            "the indexer would dead-letter it: instance.update: payload Selection 1.1 names"
            " a class of Nova's",
        ),
        # Refused as it is read, as oslo.versionedobjects refuses another project's object.
        (
            "compute_node.update",
            "NOVA",
            "MalformedNotification: payload: 'Selection' is of namespace 'NOVA', neither"
            " Nova's (nova) nor Cellsight's (cellsight)",
        ),
    ],
)
def test_validate_fails_what_the_indexer_would_dead_letter(
    cli: Invoke, tmp_path: Path, event_type: str, namespace: str, says: str
) -> None:
    """A probe: a Selection under a node or instance event validated "ok", and the
    indexer dead-lettered it (not_a_node, not_an_instance)."""
    payload = novagen.selection()
    payload["nova_object.namespace"] = namespace
    path = tmp_path / "selection.json"
    bare = {"event_type": event_type, "publisher_id": "x", "priority": "INFO", "payload": payload}
    path.write_text(json.dumps(bare))
    result = cli("notifications", "validate", path)
    assert result.exit_code == 1, result.output
    assert f"FAIL {path}: {says}" in one_line(result.stderr)
    assert "Traceback" not in result.output
