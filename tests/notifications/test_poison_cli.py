"""``cellsight notifications validate`` prints one clean ``FAIL`` line per poison file
(no traceback) and ``publish`` refuses to publish any of them."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cellsight.cli import app
from cellsight.cli.groups import register
from tests.support import novagen, poison

CORPUS = poison.corpus()
# Decided by the indexer, not the contract: these are valid notifications.
INDEXER_ONLY = {"not_an_instance", "version_past_2255"}
REASON_CLASS = {
    "malformed": "MalformedNotification",
    "invalid_envelope": "InvalidEnvelope",
    "invalid_event_type": "InvalidEventType",
    "missing_field": "MissingField",
    "unknown_major_version": "UnknownMajorVersion",
    "out_of_range": "OutOfRange",
    "too_large": "TooLarge",
}


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    if not any(group.name == "notifications" for group in app.registered_groups):
        register(app)
    return CliRunner()


@pytest.fixture(scope="module")
def poison_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("poison")
    files = {}
    for kind, (body, _) in CORPUS.items():
        if kind not in INDEXER_ONLY:
            files[kind] = folder / f"{kind}.json"
            files[kind].write_bytes(body)
    return files


def test_validate_prints_one_fail_line_per_poison_file(
    runner: CliRunner, poison_files: dict[str, Path], tmp_path: Path
) -> None:
    good = tmp_path / "good.json"
    good.write_bytes(novagen.body(poison.good()))
    result = runner.invoke(
        app, ["notifications", "validate", str(good), *map(str, poison_files.values())]
    )
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert result.stdout.splitlines() == [
        f"ok   {good}: instance.pause.end InstanceActionPayload 1.9"
    ]
    lines = result.stderr.splitlines()
    assert lines[-1].endswith(
        f"{len(poison_files)} of {len(poison_files) + 1} files failed validation"
    )
    fails = lines[:-1]
    assert len(fails) == len(poison_files)
    for (kind, path), line in zip(poison_files.items(), fails, strict=True):
        code = CORPUS[kind][1]
        assert line.startswith(f"FAIL {path}: {REASON_CLASS[code]}: "), (kind, line)
        assert len(line) < 400 + len(str(path)), kind
        assert line.isprintable(), kind


@pytest.mark.parametrize(
    "kind",
    [
        "huge_body_20mb",
        "thousand_digit_int",
        "updated_at_past_9999",
        "deep_nesting_body",
        "pickle_body",
    ],
)
def test_publish_refuses_a_poison_file(
    runner: CliRunner, poison_files: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    good = tmp_path / "good.json"
    good.write_bytes(novagen.body(poison.good()))
    data_dir = tmp_path / "data"
    result = runner.invoke(
        app,
        [
            "--data-dir",
            str(data_dir),
            "notifications",
            "publish",
            str(good),
            str(poison_files[kind]),
        ],
    )
    assert result.exit_code == 2, result.output
    assert "nothing published" in " ".join(result.stderr.split())
    assert "Traceback" not in result.output
    assert not (data_dir / "bus").exists()  # the bus was never opened
