"""Found from outside: a name, an id or a metadata item longer than Nova's
``String(255)``, or a tag Nova refuses, given to an operation failed as a runtime error
(exit 1) naming the notification payload's field; a zone of any length was taken for a
host, which then could never hold an instance; an empty queue name made RabbitMQ invent
one that collected what nothing consumed; a taken cell name still created its database.
Each is now a usage error (exit 2) naming what was given, before anything is written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cellsight.cli.errors import USAGE
from tests.cli.test_cli_errors import assert_one_line_error, cellsight
from tests.support.services import rabbitmq_names

LONG = "n" * 256


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    data = tmp_path_factory.mktemp("long") / "data"
    seed = cellsight(data, "cells", "seed", "--cells", "1", "--instances", "2")
    assert seed.returncode == 0, seed.stderr
    booted = cellsight(
        data, "ops", "boot", "--name", "ok", "--flavor", "m1.small", "--project", "p", "--user", "u"
    )
    assert booted.returncode == 0, booted.stderr
    match = re.match(r"([0-9a-f-]{36}) ", booted.stdout)
    assert match is not None, booted.stdout
    return data, match[1]


BOOT = ["ops", "boot", "--flavor", "m1.small"]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ([*BOOT, "--name", LONG, "--project", "p", "--user", "u"], "name"),
        ([*BOOT, "--name", "x", "--project", LONG, "--user", "u"], "project_id"),
        ([*BOOT, "--name", "x", "--project", "p", "--user", LONG], "user_id"),
        ([*BOOT, "--name", "x", "--project", "p", "--user", "u", "--key-name", LONG], "key_name"),
        ([*BOOT, "--name", "x", "--project", "p", "--user", "u", "--image", LONG], "image"),
        (
            [*BOOT, "--name", "x", "--project", "p", "--user", "u", "--az", LONG],
            "availability_zone",
        ),
        (["cells", "add-host", "--cell", "cell1", "--host", LONG], "host"),
        (
            ["cells", "add-host", "--cell", "cell1", "--host", "h9", "--az", LONG],
            "availability_zone",
        ),
        (["cells", "add", "--name", LONG, "--db-url", "sqlite:///never.db"], "cell name"),
    ],
)
def test_a_value_past_255_characters_is_a_usage_error_naming_it(
    seeded: tuple[Path, str], args: list[str], named: str
) -> None:
    data, _ = seeded
    result = cellsight(data, *args)
    assert_one_line_error(result, USAGE, f"{named} 'nnn", "256 characters long; at most 255")
    assert not (data.parent / "never.db").exists()


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["rename", "{uuid}", LONG], ("name 'nnn", "256 characters long")),
        (["rename", "{uuid}", ""], ("name must not be empty or blank",)),
        (["rename", "{uuid}", "   "], ("name must not be empty or blank",)),
        (["meta", "{uuid}", f"{LONG}=v"], ("metadata key 'nnn", "256 characters long")),
        (["meta", "{uuid}", f"k={LONG}"], ("metadata value of 'k' 'nnn", "256 characters")),
        (["tags", "{uuid}", "a/b"], ("invalid tags: 'a/b'",)),
        (["tags", "{uuid}", "t" * 61], ("invalid tags:", "1 to 60 characters")),
        # Nova's lock schema: 1 to 255 characters. Longer, a probe saw SQLite cells take
        # it and PostgreSQL and MariaDB cells fail it as a database error (exit 1).
        (["lock", "{uuid}", "--reason", LONG], ("reason 'nnn", "256 characters long")),
        (["lock", "{uuid}", "--reason", ""], ("reason must not be empty",)),
    ],
)
def test_an_action_with_a_value_nova_refuses_is_a_usage_error_and_changes_nothing(
    seeded: tuple[Path, str], args: list[str], needles: tuple[str, ...]
) -> None:
    data, uuid = seeded
    before = cellsight(data, "ops", "show", uuid)
    assert before.returncode == 0, before.stderr
    result = cellsight(data, "ops", *[a.replace("{uuid}", uuid) for a in args])
    assert_one_line_error(result, USAGE, *needles)
    assert cellsight(data, "ops", "show", uuid).stdout == before.stdout


@pytest.mark.parametrize("name", ["", "  "])
def test_a_boot_without_a_name_is_a_usage_error(seeded: tuple[Path, str], name: str) -> None:
    """It was "internal error: ValueError" (exit 1; found by a probe)."""
    data, _ = seeded
    result = cellsight(data, *BOOT, "--name", name, "--project", "p", "--user", "u")
    assert_one_line_error(result, USAGE, "name must not be empty or blank")


@pytest.mark.parametrize(
    "setting",
    [
        "CELLSIGHT_EXCHANGE",
        "CELLSIGHT_INDEXER_QUEUE",
        "CELLSIGHT_DEAD_LETTER_EXCHANGE",
        "CELLSIGHT_DEAD_LETTER_QUEUE",
    ],
)
def test_an_empty_exchange_or_queue_name_is_a_usage_error(tmp_path: Path, setting: str) -> None:
    result = cellsight(tmp_path / "data", "dlq", "list", env={setting: ""})
    assert_one_line_error(result, USAGE, setting.removeprefix("CELLSIGHT_").lower())


@pytest.mark.parametrize(
    "setting",
    ["CELLSIGHT_EXCHANGE", "CELLSIGHT_INDEXER_QUEUE", "CELLSIGHT_DEAD_LETTER_QUEUE"],
)
def test_an_amqp_name_is_bounded_in_bytes_not_characters(tmp_path: Path, setting: str) -> None:
    # 200 characters of "é" are 400 bytes: the broker refused them at the first declare.
    result = cellsight(tmp_path / "data", "dlq", "list", env={setting: "é" * 200})
    assert_one_line_error(result, USAGE, setting, "is 400 bytes of UTF-8", "at most 255")


def test_an_amqp_name_of_255_bytes_is_taken_by_rabbitmq(tmp_path: Path, rabbitmq_url: str) -> None:
    """The bound is the broker's: 127 "é" and one "a" (255 bytes) are declared and used."""
    queue = "é" * 127 + "a"
    rabbitmq_names(queues=[queue])
    env = {"CELLSIGHT_BUS_URL": rabbitmq_url, "CELLSIGHT_DEAD_LETTER_QUEUE": queue}
    result = cellsight(tmp_path / "data", "dlq", "list", env=env)
    assert result.returncode == 0, result.stderr
    assert "0 dead letter(s) shown" in result.stdout


def test_a_taken_cell_name_creates_no_database(seeded: tuple[Path, str], tmp_path: Path) -> None:
    data, _ = seeded
    target = tmp_path / "second.db"
    result = cellsight(data, "cells", "add", "--name", "cell1", "--db-url", f"sqlite:///{target}")
    assert_one_line_error(result, USAGE, "'cell1' is already registered")
    assert not target.exists()


def test_an_empty_path_option_is_named_not_read_as_the_working_directory(tmp_path: Path) -> None:
    """``notifications schema --out ""`` wrote its files into the working directory;
    ``--config ""`` was reported as the directory ".". Both are refused, named."""
    out = cellsight(tmp_path / "data", "notifications", "schema", "--out", "")
    assert_one_line_error(out, USAGE, "'--out'", "must not be empty")
    assert not list(tmp_path.glob("*.json"))
    config = cellsight(tmp_path / "data", "--config", "", "index", "status")
    assert_one_line_error(config, USAGE, "'--config'", "must not be empty")


def test_a_config_integer_past_pythons_digit_limit_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "big.toml"
    config.write_text(f"batch_count = {'9' * 5000}\n")
    result = cellsight(tmp_path / "data", "--config", str(config), "index", "status")
    assert_one_line_error(result, USAGE, f"--config {config}: invalid settings:", "digits")


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("9" * 18 + "s", "is longer than 365000 days"),  # was "not a duration like 30d…"
        ("9" * 5000 + "d", "is longer than 365000 days"),
        ("99999999d", "is longer than 365000 days"),
        ("30x", "is not a duration like 30d"),
    ],
)
def test_a_duration_says_why_it_is_refused(value: str, why: str) -> None:
    import typer

    from cellsight.cli.indexer_cmd import parse_duration

    with pytest.raises(typer.BadParameter, match=why):
        parse_duration(value)
    assert parse_duration("000000000000000030d").days == 30


def test_a_query_of_unknown_fields_only_is_a_usage_error(seeded: tuple[Path, str]) -> None:
    """It printed the warning, then one empty line per instance, and exited 0."""
    data, _ = seeded
    result = cellsight(data, "query", "instance", "nosuchfield,other")
    assert_one_line_error(result, USAGE, "no known field among nosuchfield, other")
    assert result.stdout == ""
    mixed = cellsight(data, "query", "instance", "uuid,nosuchfield")
    assert mixed.returncode == 0 and "Unknown field(s): nosuchfield" in mixed.stderr
