"""What a new operator met walking through the README's "Operating it": each is one
``error:`` line naming the option, file or value at fault with the documented exit code,
or no error at all. Run as the operator runs it: a subprocess of ``python -m cellsight``."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellsight.cli.errors import RUNTIME, USAGE
from cellsight.settings import Settings, load_settings, setting_label
from cellsight.settings_env import unknown_variables
from tests.cli.test_cli_errors import assert_one_line_error, cellsight, closed_port

ROOT = Path(__file__).resolve().parents[2]
# RFC 5737's TEST-NET-1: never an address of this machine.
FOREIGN_ADDRESS = "192.0.2.1"
SETTINGS = list(Settings.model_fields)


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another process listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_api_on_a_busy_port_is_one_line_naming_the_port(tmp_path: Path, busy_port: int) -> None:
    result = cellsight(tmp_path / "d", "api", "--port", str(busy_port))
    err = assert_one_line_error(result, USAGE, f"--port {busy_port}", "not free")
    assert "uvicorn" not in err.lower() and "INFO" not in result.stderr


def test_api_on_a_busy_port_from_the_environment_names_the_setting(
    tmp_path: Path, busy_port: int
) -> None:
    """It said ``--port``, which the operator never gave (an operator's walk through the
    README)."""
    result = cellsight(tmp_path / "d", "api", env={"CELLSIGHT_API_PORT": str(busy_port)})
    err = assert_one_line_error(
        result, USAGE, f"api_port (CELLSIGHT_API_PORT) {busy_port}", "not free"
    )
    assert "--port" not in err


def test_api_on_a_busy_port_from_the_config_file_names_the_file(
    tmp_path: Path, busy_port: int
) -> None:
    """It blamed CELLSIGHT_API_PORT, which was never set (a README probe)."""
    config = tmp_path / "cellsight.toml"
    config.write_text(f"api_port = {busy_port}\n")
    result = cellsight(tmp_path / "d", "--config", str(config), "api")
    err = assert_one_line_error(
        result, USAGE, f"api_port (--config {config}) {busy_port}", "not free"
    )
    assert "CELLSIGHT_API_PORT" not in err


def test_a_setting_is_labelled_by_where_its_value_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CELLSIGHT_API_PORT", raising=False)
    config = tmp_path / "c.toml"
    config.write_text("metrics_port = 9100\n")
    settings = load_settings(config)
    assert setting_label(settings, "api_port", config) == "api_port (default)"
    assert setting_label(settings, "metrics_port", config) == f"metrics_port (--config {config})"
    assert setting_label(settings, "metrics_port") == "metrics_port (--config)"
    monkeypatch.setenv("cellsight_api_port", "8000")  # read case-insensitively
    assert setting_label(load_settings(config), "api_port") == "api_port (CELLSIGHT_API_PORT)"


def test_api_on_an_address_not_of_this_machine_names_the_host(tmp_path: Path) -> None:
    result = cellsight(tmp_path / "d", "api", "--host", FOREIGN_ADDRESS, "--port", "0")
    assert_one_line_error(result, USAGE, f"--host {FOREIGN_ADDRESS}")


def test_demo_no_serve_does_not_need_the_api_port(tmp_path: Path, busy_port: int) -> None:
    # The demo's API port (8774 unless CELLSIGHT_API_PORT) is held by another process.
    env = {"CELLSIGHT_API_PORT": str(busy_port)}
    args = ("demo", "--no-serve", "--cells", "1", "--instances", "10")
    result = cellsight(tmp_path / "d", *args, env=env)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "alice (project demo) sees 2 servers" in " ".join(result.stdout.split())
    # Serving, it does need the port: refused before anything starts, naming it.
    served = cellsight(tmp_path / "d", "demo", env=env)
    assert_one_line_error(served, USAGE, f"api_port (CELLSIGHT_API_PORT) {busy_port}", "not free")


def test_seed_with_fewer_database_urls_than_cells_is_a_usage_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'one.db'}"
    result = cellsight(tmp_path / "d", "cells", "seed", "--cells", "2", "--db-url", url)
    err = assert_one_line_error(result, USAGE, "--db-url", "--cells 2")
    assert "internal error" not in err


def test_a_toml_syntax_error_names_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "cellsight.toml"
    config.write_text('api_port = 8774\ndata_dir = "x" y\n')
    result = cellsight(tmp_path / "d", "--config", str(config), "cells", "list")
    assert_one_line_error(result, USAGE, f"--config {config}", "line 2")


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("db_conect_timeout = 1", "db_conect_timeout ({config}): not a setting (did you mean "
         "db_connect_timeout?)"),
        ("db_connect_timeout = 'soon'", "db_connect_timeout ({config}): Input should be"),
    ],
)  # fmt: skip
def test_a_bad_key_or_value_in_the_config_file_names_the_file(
    tmp_path: Path, line: str, says: str
) -> None:
    """An operator's probe: both named the environment variable, which was not set."""
    config = tmp_path / "cellsight.toml"
    config.write_text(line + "\n")
    result = cellsight(tmp_path / "d", "--config", str(config), "cells", "list")
    err = assert_one_line_error(result, USAGE, says.format(config=f"--config {config}"))
    assert "CELLSIGHT_" not in err
    # The variable wins over the file: a bad one is named as such.
    result = cellsight(
        tmp_path / "d", "--config", str(config), "cells", "list",
        env={"CELLSIGHT_DB_CONNECT_TIMEOUT": "soon"},
    )  # fmt: skip
    if line.startswith("db_connect_timeout"):
        assert_one_line_error(result, USAGE, "db_connect_timeout (CELLSIGHT_DB_CONNECT_TIMEOUT)")


def test_replaying_an_unknown_reason_code_is_refused_naming_the_known_ones(
    tmp_path: Path,
) -> None:
    data = tmp_path / "d"
    result = cellsight(data, "dlq", "replay", "--reason", "malformd")
    err = assert_one_line_error(result, USAGE, "--reason 'malformd'", "malformed", "internal")
    assert all(code in err for code in readme_reason_codes())
    assert not (data / "bus").exists()  # refused before the bus was opened


def readme_reason_codes() -> set[str]:
    """The reason codes the README's "Dead letters" lists for operators."""
    section = (ROOT / "README.md").read_text().split("**Dead letters.**", 1)[1]
    listed = section.split("Codes:", 1)[1].split("The dead-letter publish", 1)[0]
    codes = set(re.findall(r"`([a-z_]+)`", listed))
    assert {"malformed", "too_large", "rejected", "internal"} <= codes, codes
    return codes


def test_every_reason_code_the_indexer_writes_is_known_to_replay() -> None:
    from cellsight.indexer.dlq import REASON_CODES

    # The codes the indexer gives a dead letter, from its source, and the ones the
    # README lists (the decoder's among them): replay accepts each.
    written = set()
    for path in (ROOT / "indexer").glob("*.py"):
        written |= set(re.findall(r'\bdead\(\s*"([a-z_]+)"', path.read_text()))
    planning = (ROOT / "indexer" / "planning.py").read_text()
    written |= set(re.findall(r'INTERNAL = "([a-z_]+)"', planning))
    assert {"rejected", "internal", "not_an_instance"} <= written
    listed = readme_reason_codes()
    assert written | listed <= set(REASON_CODES), (written | listed) - set(REASON_CODES)
    # And the README lists every code replay takes (a probe: `unknown` was missing).
    assert set(REASON_CODES) <= listed, set(REASON_CODES) - listed


@pytest.mark.parametrize(
    "command", [["query", "instance"], ["query", "fields", "node"], ["nodes", "refresh"]]
)
def test_query_an_unreachable_api_is_a_runtime_failure(tmp_path: Path, command: list[str]) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    result = cellsight(tmp_path / "d", *command, "--url", url)
    assert_one_line_error(result, RUNTIME, "cannot reach", url)


def test_an_unknown_environment_variable_is_named_with_the_setting_it_resembles(
    tmp_path: Path,
) -> None:
    """A typo in a variable's name leaves that setting at its default: the command still
    runs (the environment is shared with other programs) but says which one it ignored."""
    env = {
        "CELLSIGHT_SEARCH_ULR": "http://search:9200",
        "CELLSIGHT_API_port": "8775",  # read: names are case-insensitive
        "CELLSIGHT_REQUIRE_SERVICES": "1",  # the test suite's own: not a setting, not named
    }
    result = cellsight(tmp_path / "d", "cells", "list", env=env)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, result.stderr
    assert "ignoring CELLSIGHT_SEARCH_ULR: not a setting" in warnings[0]
    assert "did you mean CELLSIGHT_SEARCH_URL?" in warnings[0]


def test_kubernetes_service_links_are_not_named_and_typos_are() -> None:
    """What Kubernetes puts in every pod for Services named ``cellsight`` and
    ``cellsight-indexer`` is no typo; a typo close to a setting still is, and its hint
    compares the part after the prefix (``CELLSIGHT_DEBUG`` resembles no setting)."""
    links = {
        "CELLSIGHT_SERVICE_HOST": "10.0.0.1",
        "CELLSIGHT_SERVICE_PORT": "8774",
        "CELLSIGHT_SERVICE_PORT_HTTP": "8774",
        "CELLSIGHT_PORT": "tcp://10.0.0.1:8774",
        "CELLSIGHT_PORT_8774_TCP": "tcp://10.0.0.1:8774",
        "CELLSIGHT_PORT_8774_TCP_PROTO": "tcp",
        "CELLSIGHT_PORT_8774_TCP_PORT": "8774",
        "CELLSIGHT_PORT_8774_TCP_ADDR": "10.0.0.1",
        "CELLSIGHT_INDEXER_SERVICE_HOST": "10.0.0.2",
        "CELLSIGHT_INDEXER_PORT": "tcp://10.0.0.2:9100",
    }
    assert unknown_variables(links, SETTINGS) == []
    typos = {"CELLSIGHT_METRIC_PORT": "9100", "CELLSIGHT_DEBUG": "1", "CELLSIGHT_BUS_URL": "x"}
    assert unknown_variables({**links, **typos}, SETTINGS) == [
        "ignoring CELLSIGHT_DEBUG: not a setting",
        "ignoring CELLSIGHT_METRIC_PORT: not a setting (did you mean CELLSIGHT_METRICS_PORT?)",
    ]


def test_a_setting_holding_a_service_link_says_where_it_came_from(tmp_path: Path) -> None:
    """A Kubernetes Service named ``cellsight-api`` sets CELLSIGHT_API_PORT to
    ``tcp://10.0.0.1:8774`` in every pod beside it: the error said only "unable to parse
    string as an integer" (a README probe)."""
    env = {"CELLSIGHT_API_PORT": "tcp://10.0.0.1:8774"}
    result = cellsight(tmp_path / "d", "cells", "list", env=env)
    err = assert_one_line_error(result, USAGE, "api_port (CELLSIGHT_API_PORT)")
    assert "a Service named 'cellsight-api'" in err and "enableServiceLinks: false" in err


def test_an_indexer_on_a_busy_metrics_port_names_the_setting(
    tmp_path: Path, busy_port: int
) -> None:
    result = cellsight(tmp_path / "d", "indexer", env={"CELLSIGHT_METRICS_PORT": str(busy_port)})
    assert_one_line_error(
        result, USAGE, f"metrics_port (CELLSIGHT_METRICS_PORT) {busy_port} is not free"
    )


def test_an_empty_metrics_port_or_verify_interval_is_off() -> None:
    """A template's empty value (`CELLSIGHT_METRICS_PORT=`) means the default, off, as for
    the other optional settings; it was a usage error."""
    settings = load_settings(metrics_port="", verify_interval="")
    assert (settings.metrics_port, settings.verify_interval) == (None, None)
