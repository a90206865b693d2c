"""A freeze of osmem for 0.4 s as ``index verify`` began failed it in one line: asking
the engine what it is (``detect_distribution``), a maintenance command's first request,
was the one step of its run not retried. Now a sync, a verify and a purge ask again when
no answer comes in ``search_timeout``, as their other steps do; a refused connection
still fails at once, and the API and ``index status`` do not wait."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cellsight.cli.errors import RUNTIME
from tests.cli.test_cli_errors import assert_one_line_error, cellsight, closed_port
from tests.support.bulk_faults import TIMEOUT, BulkFaults
from tests.support.services import osmem_clone_url

COMMANDS = {
    "sync": ["index", "sync"],
    "verify": ["index", "verify", "--type", "instance"],
    "purge": ["index", "purge"],
}


@pytest.mark.services
@pytest.mark.parametrize("command", COMMANDS)
def test_a_maintenance_command_rides_out_an_engine_slow_to_say_what_it_is(
    request: pytest.FixtureRequest, tmp_path: Path, command: str
) -> None:
    proxy = BulkFaults(osmem_clone_url(request), endpoint="/")
    env = {"CELLSIGHT_SEARCH_URL": proxy.url, "CELLSIGHT_SEARCH_TIMEOUT": "1"}
    data = tmp_path / "d"
    cell = ["cells", "add", "--name", "cell1", "--db-url", f"sqlite:///{tmp_path / 'c1.db'}"]
    for before in (cell, COMMANDS["sync"]):
        made = cellsight(data, *before, env=env)
        assert made.returncode == 0, (made.stdout, made.stderr)
    proxy.arm(TIMEOUT, first=1, times=1)  # the command's first request: GET /
    result = cellsight(data, *COMMANDS[command], env=env)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "asking the search engine what it is failed (EngineTimeout" in result.stderr
    assert len(proxy.spoiled) == 1  # the first GET / went unanswered, the next did not


@pytest.mark.parametrize("command", [*COMMANDS, "status"])
def test_a_refused_connection_still_fails_at_once(tmp_path: Path, command: str) -> None:
    port = closed_port()
    env = {"CELLSIGHT_SEARCH_URL": f"http://127.0.0.1:{port}"}
    started = time.monotonic()
    argv = ["index", "status"] if command == "status" else COMMANDS[command]
    result = cellsight(tmp_path / "d", *argv, env=env)
    assert_one_line_error(result, RUNTIME, f"127.0.0.1:{port}", "unreachable")
    assert "retry" not in result.stderr
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("engine", ["embedded", pytest.param("osmem", marks=pytest.mark.services)])
def test_a_purge_before_any_sync_purges_nothing(
    request: pytest.FixtureRequest, tmp_path: Path, engine: str
) -> None:
    """Found beside the above: before a first sync a purge failed (exit 1), "alias
    cellsight-instance does not exist" on the embedded engine, osmem's raw 404 on HTTP."""
    env = {"CELLSIGHT_SEARCH_URL": osmem_clone_url(request)} if engine == "osmem" else {}
    result = cellsight(tmp_path / "d", "index", "purge", env=env)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert result.stdout.startswith("purged 0 tombstone(s)"), result.stdout
