"""Operator errors are one line: each failure a command can meet prints ``error: …``
naming what failed (passwords masked), exits by the documented convention (1 runtime,
2 usage) and shows no traceback unless ``--debug``. Run as the operator runs it: a
subprocess of the installed entry point."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from cellsight.cli.errors import RUNTIME, USAGE
from tests.support.waiting import spawned, wait_for

SECRET = "s3cr3t-pw"
HUGE = "9" * 1000  # an integer of a thousand digits


def cellsight(
    data_dir: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CELLSIGHT_")}
    # There, as after a first `cells add`: a missing one is test_cli_missing_paths' subject.
    data_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "cellsight", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **(env or {})},
        cwd=data_dir.parent,
    )


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def assert_one_line_error(
    result: subprocess.CompletedProcess[str], code: int, *needles: str
) -> str:
    err = result.stderr.strip()
    assert result.returncode == code, (result.returncode, result.stdout, err)
    assert "Traceback" not in err and "Traceback" not in result.stdout
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: "), err
    for needle in needles:
        assert needle in err, (needle, err)
    assert SECRET not in err
    return err


@pytest.mark.parametrize("command", [["dlq", "list"], ["dlq", "replay"]])
def test_dlq_with_the_bus_down_names_the_masked_url(tmp_path: Path, command: list[str]) -> None:
    port = closed_port()
    url = f"amqp://guest:{SECRET}@127.0.0.1:{port}//"
    result = cellsight(tmp_path / "d", *command, env={"CELLSIGHT_BUS_URL": url})
    assert_one_line_error(result, RUNTIME, f"127.0.0.1:{port}", "unavailable")


@pytest.mark.services
@pytest.mark.parametrize("command", [["dlq", "list"], ["dlq", "replay"]])
def test_dlq_with_a_wrong_password_says_refused(
    tmp_path: Path, rabbitmq_url: str, command: list[str]
) -> None:
    url = sa.make_url(rabbitmq_url.replace("amqp://", "mysql://"))  # parse user/host only
    bad = f"amqp://{url.username}:{SECRET}@{url.host}:{url.port}//"
    result = cellsight(tmp_path / "d", *command, env={"CELLSIGHT_BUS_URL": bad})
    assert_one_line_error(result, RUNTIME, "ACCESS_REFUSED", f"{url.host}:{url.port}")


def _refusing_urls(rabbitmq_url: str, redis_url: str) -> dict[str, tuple[str, str]]:
    """Bus URLs a reachable broker turns away, and what its refusal names."""
    amqp = sa.make_url(rabbitmq_url.replace("amqp://", "mysql://"))  # parse user/host only
    redis = sa.make_url(redis_url.replace("redis://", "mysql://"))
    where = f"{amqp.username}:{amqp.password}@{amqp.host}:{amqp.port}"
    return {
        "unknown vhost": (f"amqp://{where}/cellsight-no-such-vhost", "NOT_ALLOWED"),
        "redis user": (
            f"redis://cellsight-no-such-user:{SECRET}@{redis.host}:{redis.port}/0",
            "AuthenticationError",
        ),
    }


@pytest.mark.services
@pytest.mark.parametrize("case", ["unknown vhost", "redis user"])
def test_an_indexer_the_broker_turns_away_exits_with_one_line(
    tmp_path: Path, rabbitmq_url: str, redis_url: str, case: str
) -> None:
    """A vhost that does not exist, or credentials refused, is a configuration to fix:
    the indexer stops at once instead of reconnecting forever (as a refused AMQP login
    already did)."""
    url, needle = _refusing_urls(rabbitmq_url, redis_url)[case]
    result = cellsight(tmp_path / "d", "indexer", env={"CELLSIGHT_BUS_URL": url})
    assert result.returncode == RUNTIME, (result.stdout, result.stderr)
    err = result.stderr.strip()
    assert "Traceback" not in err
    assert "reconnecting" not in err
    last = err.splitlines()[-1]
    assert last.startswith("error: message bus ") and needle in last, err
    assert SECRET not in err


@pytest.mark.services
@pytest.mark.parametrize("case", ["unknown vhost", "redis user"])
def test_dlq_list_the_broker_turns_away_says_refused(
    tmp_path: Path, rabbitmq_url: str, redis_url: str, case: str
) -> None:
    url, needle = _refusing_urls(rabbitmq_url, redis_url)[case]
    result = cellsight(tmp_path / "d", "dlq", "list", env={"CELLSIGHT_BUS_URL": url})
    assert_one_line_error(result, RUNTIME, "refused the connection", needle)


@pytest.mark.parametrize("command", [["dlq", "list"], ["dlq", "replay"]])
def test_dlq_with_an_unknown_transport_is_a_usage_error(tmp_path: Path, command: list[str]) -> None:
    result = cellsight(tmp_path / "d", *command, env={"CELLSIGHT_BUS_URL": "carrier-pigeon://x"})
    assert_one_line_error(result, USAGE, "'carrier-pigeon'")


@pytest.mark.parametrize(
    "command",
    [["index", "get", "0b3a6c1e-0000-4000-8000-000000000001"], ["index", "purge"]],
)
def test_index_commands_with_the_engine_down(tmp_path: Path, command: list[str]) -> None:
    port = closed_port()
    url = f"http://elastic:{SECRET}@127.0.0.1:{port}"
    result = cellsight(tmp_path / "d", *command, env={"CELLSIGHT_SEARCH_URL": url})
    assert_one_line_error(result, RUNTIME, f"127.0.0.1:{port}", "unreachable")


def test_index_get_of_what_is_no_uuid_is_a_usage_error(tmp_path: Path) -> None:
    """An operator probe: it read the index and exited 1, "no instance document"; the
    exit codes' table makes a bad value 2, as `ops show` answers."""
    result = cellsight(tmp_path / "d", "index", "get", "not-a-uuid")
    assert_one_line_error(result, USAGE, "not a UUID: 'not-a-uuid'")


def _cell_without_tables(tmp_path: Path) -> Path:
    data = tmp_path / "d"
    db = tmp_path / "cell1.db"
    added = cellsight(data, "cells", "add", "--name", "cell1", "--db-url", f"sqlite:///{db}")
    assert added.returncode == 0, added.stderr
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        assert "instances" in tables
        for table in tables:
            conn.execute(f"DROP TABLE {table}")
    return data


@pytest.mark.parametrize(
    "command",
    [
        ["cells", "list", "--counts"],
        ["index", "sync"],
        ["ops", "boot", "--name", "x", "--flavor", "m1.small", "--project", "p", "--user", "u"],
    ],
)
def test_commands_on_a_cell_database_without_tables(tmp_path: Path, command: list[str]) -> None:
    data = _cell_without_tables(tmp_path)
    result = cellsight(data, *command)
    if command[:2] == ["cells", "list"]:
        # a listing shows the broken cell in its row instead of failing
        assert result.returncode in (0, RUNTIME)
        text = result.stdout + result.stderr
        assert "no such table" in text and "Traceback" not in text
        return
    assert_one_line_error(result, RUNTIME, "no such table")


def test_the_missing_table_hint_comes_with_a_missing_table_only(tmp_path: Path) -> None:
    """An adversarial probe: a full disk said "database or disk is full (a missing table
    means it is not a cell database yet ...)". Real driver errors, through SQLAlchemy."""
    from cellsight.cli.errors import describe

    path = tmp_path / "f.db"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.commit()
    engine = sa.create_engine(f"sqlite:///{path}")
    failures = []
    for statement in ("SELECT * FROM nowhere", "INSERT INTO t VALUES (1)"):
        with pytest.raises(sa.exc.OperationalError) as failed, engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA query_only=ON")  # writes fail as on a read-only file
            conn.exec_driver_sql(statement)
        failures.append(describe(failed.value)[1])
    engine.dispose()
    missing, readonly = failures
    assert "no such table: nowhere" in missing and "a missing table means" in missing
    assert "readonly database" in readonly and "missing table" not in readonly


def test_cells_add_refuses_a_sqlite_path_in_a_missing_directory(tmp_path: Path) -> None:
    target = tmp_path / "nonexistent" / "dir" / "x.db"
    result = cellsight(
        tmp_path / "d", "cells", "add", "--name", "c", "--db-url", f"sqlite:///{target}"
    )
    assert_one_line_error(result, USAGE, "--db-url", "--create", str(target.parent))
    assert not (tmp_path / "nonexistent").exists()
    created = cellsight(
        tmp_path / "d", "cells", "add", "--name", "c", "--db-url", f"sqlite:///{target}", "--create"
    )
    assert created.returncode == 0, created.stderr
    assert target.is_file()


def test_cells_add_checks_a_server_database_is_reachable(tmp_path: Path) -> None:
    port = closed_port()
    url = f"mysql://root:{SECRET}@127.0.0.1:{port}/cell"
    result = cellsight(tmp_path / "d", "cells", "add", "--name", "c", "--db-url", url)
    assert_one_line_error(result, RUNTIME, f"127.0.0.1:{port}", "unavailable")
    listed = cellsight(tmp_path / "d", "cells", "list")
    assert "127.0.0.1" not in listed.stdout  # nothing registered


@pytest.mark.services
def test_cells_add_accepts_a_reachable_mariadb(tmp_path: Path, make_database: object) -> None:
    url = make_database("mariadb")  # type: ignore[operator]
    result = cellsight(tmp_path / "d", "cells", "add", "--name", "m", "--db-url", url)
    assert result.returncode == 0, result.stderr
    assert "added cell m" in result.stdout


def test_debug_shows_the_traceback_instead(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    result = cellsight(
        tmp_path / "d", "--debug", "index", "purge", env={"CELLSIGHT_SEARCH_URL": url}
    )
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "EngineUnavailable" in result.stderr


def test_bad_settings_are_a_usage_error(tmp_path: Path) -> None:
    result = cellsight(tmp_path / "d", "index", "purge", env={"CELLSIGHT_BATCH_COUNT": "-5"})
    assert_one_line_error(result, USAGE, "batch_count")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["index", "sync", "--batch-size", "0"], "'--batch-size'"),
        (["index", "verify", "--workers", "many"], "'--workers'"),
        (["index", "sync", "--bogus"], "--bogus"),
        (["nocmd"], "'nocmd'"),
        (["index", "sync", "--type"], "'--type'"),
        # A count of many digits: before, a seed or a boot ran for ever, a sync with as
        # many workers hung, and a node's capacity failed as an internal OverflowError.
        (["cells", "seed", "--instances", HUGE, "--notify"], "'--instances'"),
        (["demo", "--instances", HUGE, "--no-serve"], "'--instances'"),
        (["ops", "boot", "--name", "a", "--flavor", "m1.tiny", "--count", HUGE], "'--count'"),
        (["index", "sync", "--workers", HUGE], "'--workers'"),
        (["index", "sync", "--batch-size", HUGE], "'--batch-size'"),
        (["cells", "add-host", "--cell", "c", "--host", "h", "--vcpus", HUGE], "'--vcpus'"),
        # Past what the cells' Integer columns hold: a driver error on PostgreSQL and
        # MariaDB (an adversarial probe), though SQLite took it.
        (
            ["cells", "add-host", "--cell", "c", "--host", "h", "--memory-mb", str(2**31)],
            "'--memory-mb'",
        ),
        # URLs urllib cannot split (an adversarial probe): an internal ValueError.
        (["nodes", "refresh", "--url", "http://[::1"], "Invalid IPv6 URL"),
        (["query", "node", "name", "--url", "http://h:99999999"], "Port out of range"),
        # Bytes that are not UTF-8 (lone surrogates to Python): failed as an internal
        # UnicodeEncodeError once the name reached the database.
        (["cells", "add-host", "--cell", "\udcff\udcfex", "--host", "h"], "is not valid UTF-8"),
    ],
)
def test_usage_errors_are_one_line_naming_the_bad_value(
    tmp_path: Path, args: list[str], named: str
) -> None:
    # Click's own form was the usage, a hint and a boxed message: five lines.
    assert_one_line_error(cellsight(tmp_path / "d", *args), USAGE, named)


def test_embedded_bus_commands_are_quiet_by_default(tmp_path: Path) -> None:
    quiet = cellsight(tmp_path / "d", "dlq", "list")
    assert quiet.returncode == 0, quiet.stderr
    assert "INFO" not in quiet.stderr and "redis-server" not in quiet.stderr
    loud = cellsight(tmp_path / "d", "-v", "dlq", "list")
    assert loud.returncode == 0, loud.stderr
    assert "INFO" in loud.stderr and "redis-server" in loud.stderr


def test_api_help_shows_the_real_defaults() -> None:
    from cellsight.settings import Settings

    result = subprocess.run(
        [sys.executable, "-m", "cellsight", "api", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 0
    defaults = Settings.model_fields
    assert f"default: {defaults['api_host'].default}" in result.stdout
    assert f"default: {defaults['api_port'].default}" in result.stdout
    assert "api_host" not in result.stdout


def test_every_command_and_option_has_help() -> None:
    import typer.main

    from cellsight.cli import app

    root = typer.main.get_command(app)
    missing: list[str] = []

    def walk(command: object, path: str) -> None:
        commands = getattr(command, "commands", None)
        if commands:
            for name, sub in commands.items():
                walk(sub, f"{path} {name}")
            return
        if not getattr(command, "help", None):
            missing.append(path)
        for param in getattr(command, "params", []):
            if param.param_type_name == "option" and not getattr(param, "help", None):
                missing.append(f"{path} {param.opts[0]}")

    walk(root, "cellsight")
    assert not missing, missing


def test_command_modules_do_not_import_each_other_in_a_cycle() -> None:
    import ast

    root = Path(__file__).resolve().parents[2] / "cellsight" / "cli"
    graph: dict[str, set[str]] = {}
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        module = f"cellsight.cli.{path.stem}" if path.stem != "__init__" else "cellsight.cli"
        graph[module] = {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("cellsight.cli")
        }

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    # the package itself registers the groups; every other module may not loop back
    cycles = [m for m in graph if m != "cellsight.cli" and reaches(m, m, {m})]
    assert not cycles, cycles


def test_an_idle_indexer_whose_writer_dies_exits_with_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CELLSIGHT_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cellsight", "--data-dir", str(data), "indexer"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean,
        cwd=tmp_path,
    )
    try:
        wait_for(lambda: bool(spawned(proc.pid)), 60, "the writer process")
        writer = spawned(proc.pid)[0]
        assert writer is not None
        os.kill(writer, signal.SIGKILL)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    _, err = proc.communicate()
    assert code == RUNTIME, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: writer process exited"), err
    assert "Traceback" not in err


def test_a_value_that_reads_as_markup_is_named_as_given(tmp_path: Path) -> None:
    """An error names the bad value as typed: a path with "[x]" in it, once escaped twice
    (printed as "\\[x]"), and a bare "[x]" would have been swallowed as a markup tag."""
    missing = tmp_path / "[x]" / "n.json"
    result = cellsight(tmp_path / "d", "notifications", "publish", str(missing))
    err = assert_one_line_error(result, USAGE, f"{missing}:")
    assert "\\[" not in err
