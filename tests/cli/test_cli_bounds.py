"""Every number the operator gives is finite and bounded, refused as a usage error naming
it: an option (``--every inf``), a setting (``CELLSIGHT_PUBLISH_TIMEOUT=inf``) or a
``--config`` that is no TOML file. Before, such a value passed the checks (only > 0) and
failed later: a thread's wait overflowed (the thread died, the command hung or printed a
traceback), or a timedelta could not hold it. Run as the operator runs it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cellsight.cli import bounds
from cellsight.cli.errors import RUNTIME, USAGE
from cellsight.settings import MAX_SECONDS, ConfigError, Settings, load_settings
from tests.cli.test_cli_errors import HUGE, assert_one_line_error, cellsight


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["outbox", "relay", "--every", "inf"], "'--every'"),
        (["outbox", "relay", "--every", "1e10"], "'--every'"),
        (["outbox", "relay", "--every", "nan"], "'--every'"),
        (["outbox", "relay", "--every", str(MAX_SECONDS + 1)], "'--every'"),
        (["demo", "--interval", "inf", "--no-serve"], "'--interval'"),
        (["dlq", "list", "--limit", HUGE], "'--limit'"),
        (["dlq", "replay", "--limit", HUGE], "'--limit'"),
        (["index", "sync", "--keep-old", HUGE], "'--keep-old'"),
    ],
)
def test_numeric_options_have_a_finite_upper_bound(
    tmp_path: Path, args: list[str], named: str
) -> None:
    # `outbox relay --every inf` hung here (the relay thread dead): the subprocess's
    # timeout would fail the test rather than the assertion.
    assert_one_line_error(cellsight(tmp_path / "d", *args), USAGE, named)


def test_the_options_and_the_settings_share_one_longest_duration() -> None:
    assert bounds.MAX_SECONDS == MAX_SECONDS


@pytest.mark.parametrize(
    ("variable", "value", "args"),
    [
        ("CELLSIGHT_PUBLISH_TIMEOUT", "inf", ["outbox", "relay"]),
        ("CELLSIGHT_BUS_VISIBILITY_TIMEOUT", "inf", ["dlq", "list"]),
        ("CELLSIGHT_OUTBOX_LEASE", "inf", ["outbox", "relay"]),
        ("CELLSIGHT_OUTBOX_LEASE", "1e300", ["outbox", "relay"]),
        ("CELLSIGHT_CELL_TIMEOUT", "1e10", ["cells", "list"]),
        ("CELLSIGHT_CELL_TIMEOUT", "nan", ["cells", "list"]),
        ("CELLSIGHT_INDEX_PROBE_INTERVAL", "inf", ["cells", "list"]),
        ("CELLSIGHT_NODE_CACHE_REFRESH", "inf", ["cells", "list"]),
        ("CELLSIGHT_OUTBOX_RELAY_INTERVAL", "inf", ["cells", "list"]),
        ("CELLSIGHT_BATCH_AGE_MS", HUGE, ["cells", "list"]),
        ("CELLSIGHT_PREFETCH", "65536", ["cells", "list"]),
    ],
)
def test_a_setting_past_its_bound_is_a_usage_error_naming_it(
    tmp_path: Path, variable: str, value: str, args: list[str]
) -> None:
    result = cellsight(tmp_path / "d", *args, env={variable: value})
    assert_one_line_error(result, USAGE, f"({variable})")


def test_the_api_refuses_an_infinite_setting_before_serving(tmp_path: Path) -> None:
    # Served before: /readyz was a 500 (inf is no JSON) and the prober thread died.
    result = cellsight(
        tmp_path / "d", "api", "--port", "0", env={"CELLSIGHT_INDEX_PROBE_INTERVAL": "inf"}
    )
    assert_one_line_error(result, USAGE, "CELLSIGHT_INDEX_PROBE_INTERVAL")


DURATIONS = [
    name
    for name, info in Settings.model_fields.items()
    if info.annotation is float or "float" in str(info.annotation)
]


def test_every_duration_setting_is_bounded() -> None:
    assert len(DURATIONS) >= 13, DURATIONS  # the listing above found them all
    for name in DURATIONS:
        for bad in (float("inf"), float("-inf"), float("nan"), MAX_SECONDS * 2):
            with pytest.raises(ConfigError, match=f"CELLSIGHT_{name.upper()}"):
                load_settings(None, **{name: bad})
        assert getattr(load_settings(None, **{name: MAX_SECONDS}), name) == MAX_SECONDS


@pytest.mark.parametrize(
    ("config", "says"),
    [
        (Path("/dev/null"), "not a regular file"),
        (None, "is a directory"),
        (Path("/nonexistent/cellsight.toml"), "no such file"),
    ],
)
def test_a_config_that_is_no_toml_file_says_what_it_is(
    tmp_path: Path, config: Path | None, says: str
) -> None:
    given = str(config or tmp_path)
    result = cellsight(tmp_path / "d", "--config", given, "cells", "list")
    err = assert_one_line_error(result, USAGE, f"--config {given}", says)
    assert "no such file" not in err or says == "no such file"


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_token_file_that_is_no_file_says_what_it_is(tmp_path: Path, kind: str) -> None:
    """A FIFO nobody writes blocked `cellsight api` at start-up for ever, and /dev/zero
    was read until memory ran out: refused as `--config` is, before anything is read."""
    given = {"fifo": tmp_path / "tokens", "device": Path("/dev/zero"), "directory": tmp_path}
    if kind == "fifo":
        os.mkfifo(given["fifo"])
    says = "is a directory" if kind == "directory" else "not a regular file"
    env = {"CELLSIGHT_AUTH_MODE": "token", "CELLSIGHT_TOKEN_FILE": str(given[kind])}
    result = cellsight(tmp_path / "d", "api", "--port", "0", env=env)
    assert_one_line_error(result, USAGE, f"token file {given[kind]}", says)


def test_validate_reads_no_more_than_the_body_limit(tmp_path: Path) -> None:
    # /dev/zero was read whole: "internal error: MemoryError" after a long wait.
    result = cellsight(tmp_path / "d", "notifications", "validate", "/dev/zero")
    assert result.returncode == RUNTIME, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("FAIL /dev/zero: TooLarge"), lines
    assert lines[-1] == "error: 1 of 1 files failed validation", lines
    assert "MemoryError" not in result.stderr and "Traceback" not in result.stderr


def test_publish_refuses_an_oversized_file_before_the_bus(tmp_path: Path) -> None:
    from cellsight.notifications.limits import MAX_BODY_BYTES

    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_BODY_BYTES + 1))
    result = cellsight(tmp_path / "d", "notifications", "publish", str(big))
    assert_one_line_error(result, USAGE, str(big), "TooLarge", "nothing published")


def test_the_options_and_the_settings_wait_at_most_as_long() -> None:
    """The CLI keeps its own copy of the bound (its command tree must not import the
    settings: start-up time); the two must not drift apart."""
    from cellsight import settings
    from cellsight.cli import bounds

    assert bounds.MAX_SECONDS == settings.MAX_SECONDS
