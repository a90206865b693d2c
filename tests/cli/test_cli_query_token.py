"""``cellsight query --url`` and ``cellsight nodes refresh --url`` against an API in
``auth_mode=token``: the token comes from ``--token`` or ``CELLSIGHT_API_TOKEN``; without
one the API's 401 is one line saying how to give it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from cellsight.api.app import create_app
from cellsight.cells.mappings import CellRegistry
from cellsight.cli.errors import USAGE
from cellsight.settings import load_settings
from tests.cli.test_cli_errors import assert_one_line_error, cellsight

TOKEN = "t0k3n-admin-7f3a"
SECRET = "t0k3n-wrong-91c2"


@pytest.fixture
def token_api(tmp_path: Path) -> Iterator[str]:
    tokens = tmp_path / "tokens.json"
    principal = {"user_id": "ops", "project_id": "admin", "roles": ["admin"]}
    tokens.write_text(json.dumps({TOKEN: principal}))
    settings = load_settings(data_dir=tmp_path / "api", auth_mode="token", token_file=tokens)
    CellRegistry.from_settings(settings).close()  # the API database, with no cells yet
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=0, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not (server.started and server.servers):
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


COMMANDS = [
    ["query", "instance", "name,status"],
    ["query", "fields", "node"],
    ["nodes", "refresh"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "-".join(c[:2]))
def test_token_mode_needs_and_takes_a_token(
    tmp_path: Path, token_api: str, command: list[str]
) -> None:
    data = tmp_path / "d"
    refused = cellsight(data, *command, "--url", token_api)
    assert_one_line_error(refused, USAGE, "401", "--token", "CELLSIGHT_API_TOKEN")

    wrong = cellsight(data, *command, "--url", token_api, "--token", SECRET)
    err = assert_one_line_error(wrong, USAGE, "401")
    assert SECRET not in err

    given = cellsight(data, *command, "--url", token_api, "--token", TOKEN)
    assert given.returncode == 0, given.stderr
    from_env = cellsight(data, *command, "--url", token_api, env={"CELLSIGHT_API_TOKEN": TOKEN})
    assert from_env.returncode == 0, from_env.stderr
    assert from_env.stdout == given.stdout or command[0] == "nodes"  # refresh times itself


def test_the_option_wins_over_the_environment(tmp_path: Path, token_api: str) -> None:
    env = {"CELLSIGHT_API_TOKEN": SECRET}
    result = cellsight(
        tmp_path / "d", "nodes", "refresh", "--url", token_api, "--token", TOKEN, env=env
    )
    assert result.returncode == 0, result.stderr


def test_a_token_without_url_is_a_usage_error(tmp_path: Path) -> None:
    result = cellsight(tmp_path / "d", "query", "instance", "--token", TOKEN)
    err = assert_one_line_error(result, USAGE, "--token", "--url")
    assert TOKEN not in err
