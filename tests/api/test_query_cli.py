"""``cellsight query …`` and ``cellsight nodes refresh``: from the local data directory
and from a running API (uvicorn on a free port), the same tables."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from cellsight.api.app import create_app
from cellsight.cli.query_cmd import format_unit, render_table
from cellsight.settings import load_settings
from tests.cells.test_cells_cli import Invoke, cli

__all__ = ["cli"]


@pytest.fixture
def data(cli: Invoke, tmp_path: Path) -> Path:
    for name in ("east", "west"):
        url = f"sqlite:///{tmp_path / name}.db"
        assert cli("cells", "add", "--name", name, "--db-url", url).exit_code == 0
        assert cli("cells", "add-host", "--cell", name, "--host", f"{name}-1").exit_code == 0
    for i, flavor in enumerate(("m1.small", "m1.large")):
        booted = cli(
            "ops", "boot", "--name", f"web-{i}", "--flavor", flavor, "--project", "p", "--user", "u"
        )
        assert booted.exit_code == 0, booted.output
    assert cli("ops", "reserve", "--uuid", "0b3e7c4c-0000-4000-8000-0000000000c1").exit_code == 0
    return tmp_path / "data"


@pytest.fixture
def server(data: Path) -> Iterator[str]:
    config = uvicorn.Config(create_app(load_settings(data_dir=data)), host="127.0.0.1", port=0)
    served = uvicorn.Server(config)
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not (served.started and served.servers):
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)  # polling the server's own started flag
    port = served.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    served.should_exit = True
    thread.join(10)


def lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def test_instance_table_filter_and_separator(cli: Invoke, data: Path) -> None:
    table = cli("query", "instance", "name,flavor_name,flavor_memory_mb,locked", "--filter",
                'name =~ m/^web/')  # fmt: skip
    assert table.exit_code == 0, table.output
    out = lines(table.output)
    assert out[0].split() == ["Instance", "FlavorName", "FlavorMemoryMB", "Locked"]
    assert sorted(" ".join(line.split()) for line in out[1:]) == [
        "web-0 m1.small 2.0G N", "web-1 m1.large 8.0G N",
    ]  # fmt: skip
    plain = cli("query", "instance", "name,flavor_memory_mb", "--filter", 'name == "web-1"',
                "--separator", "|", "--no-headers", "--units", "m")  # fmt: skip
    assert lines(plain.output) == ["web-1|8192"]


def test_forthcoming_status_3_unknown_fields_and_strict(cli: Invoke, data: Path) -> None:
    got = cli("query", "instance", "uuid,name,bogus", "--filter", "forthcoming")
    assert got.exit_code == 0
    assert "Unknown field(s): bogus" in got.output
    assert lines(got.output)[-1].split() == ["0b3e7c4c-0000-4000-8000-0000000000c1", "(unavail)"]
    strict = cli("query", "instance", "uuid,bogus", "--strict")
    assert strict.exit_code == 1
    assert cli("query", "instance", "uuid", "--strict").exit_code == 0
    # (unavail) is an answer (the item has no such value), not missing data.
    unavail = cli("query", "instance", "uuid,name", "--filter", "forthcoming", "--strict")
    assert "(unavail)" in unavail.output and unavail.exit_code == 0


def test_errors_are_one_line_naming_the_column(cli: Invoke, data: Path) -> None:
    bad = cli("query", "instance", "name", "--filter", "name == ")
    assert bad.exit_code == 2 and "column 9" in bad.output
    assert cli("query", "instance", "--units", "x").exit_code == 2
    for option in ("--url", "--token"):  # an empty --url was the local data directory
        empty_option = cli("query", "instance", "uuid", option, "")
        assert empty_option.exit_code == 2 and f"{option}: must not be empty" in empty_option.output
    for empty in ("", ",,,", " , "):  # they fell back to the default fields, exit 0
        none = cli("query", "instance", empty)
        assert none.exit_code == 2 and "FIELDS names no field" in none.output, none.output
    assert "unknown resource" in cli("query", "fields", "flavor").output


def test_fields_json_and_nodes(cli: Invoke, data: Path) -> None:
    listed = cli("query", "fields", "node")
    assert listed.exit_code == 0 and "memory_mb_used" in listed.output
    as_json = cli("query", "node", "host,vcpus_used", "--json")
    assert as_json.exit_code == 0 and '"data"' in as_json.output
    refreshed = cli("nodes", "refresh")
    assert refreshed.exit_code == 0 and refreshed.output.startswith("2 nodes from cells")
    assert "a check only: --url fills a running API's node cache" in refreshed.output


def test_the_api_answers_as_the_data_directory(cli: Invoke, data: Path, server: str) -> None:
    for args in (
        ["query", "instance", "name,status,host", "--filter", "not forthcoming"],
        ["query", "node", "host,memory_mb_used,offline", "--units", "g"],
        ["query", "fields", "instance"],
    ):
        local, remote = cli(*args), cli(*args, "--url", server)
        assert local.exit_code == remote.exit_code == 0, remote.output
        assert local.output == remote.output
    bad = cli("query", "node", "host", "--filter", "offline ==", "--url", server)
    assert bad.exit_code == 2 and "400" in bad.output and "column 11" in bad.output
    remote = cli("nodes", "refresh", "--url", server)
    assert remote.exit_code == 0 and "a check only" not in remote.output
    # The endpoint the demo prints and a catalog lists (a probe: a bare 404), and a path
    # that is neither.
    versioned = cli("query", "fields", "node", "--url", f"{server}/v2.1/")
    assert versioned.exit_code == 0 and versioned.output == cli("query", "fields", "node").output
    elsewhere = cli("query", "fields", "node", "--url", f"{server}/compute")
    assert elsewhere.exit_code == 2 and "--url is the API's root" in elsewhere.output
    down = cli("query", "node", "--url", "http://127.0.0.1:9")
    assert down.exit_code == 1 and "cannot reach" in down.output  # runtime: not a usage error


def test_units_as_ganeti_formats_them() -> None:
    assert [format_unit(v, "h") for v in (512, 2048, 3 * 1024 * 1024)] == ["512M", "2.0G", "3.0T"]
    assert (format_unit(2048, "m"), format_unit(2048, "g")) == ("2048", "2.0")
    heads = [
        {"name": "n", "title": "N", "kind": "text"},
        {"name": "x", "title": "X", "kind": "number"},
    ]
    assert render_table(heads, [[[0, "a"], [0, 5]], [[0, "bbb"], [3, None]]]) == [
        "N           X", "a           5", "bbb (unavail)",
    ]  # fmt: skip
    sizes = [{"name": "memory_mb", "title": "MemoryMB", "kind": "unit"}, *heads[1:]]
    row = [[[0, 3072], [0, 5]]]
    assert render_table(sizes, row, units="g") == ["MemoryMB (GiB) X", "           3.0 5"]
    assert render_table(sizes, row, units="m")[0] == "MemoryMB (MiB) X"
    assert render_table(sizes, row)[:2] == ["MemoryMB X", "    3.0G 5"]


def test_local_queries_use_a_synced_index_without_a_server(cli: Invoke, data: Path) -> None:
    """No server lifespan runs for ``cellsight query``, so no background prober: the
    local source probes once itself, and a synced index serves (the safe-connect flag
    stays clear) instead of every local query falling back to the cells."""
    from cellsight.cli.querysource import LocalSource

    for resource in ("instance", "node"):
        assert cli("index", "sync", "--type", resource).exit_code == 0
    source = LocalSource(load_settings(data_dir=data))
    answer = source.query("node", ["name", "cell"], None)
    state = source.app.state
    assert len(answer.body["data"]) == 2
    assert not state.safe_connect.flagged
    assert state.search.choose()[0] == "index"


def test_refresh_reads_every_cell_even_when_the_index_serves_nodes(
    cli: Invoke, data: Path, tmp_path: Path
) -> None:
    """A probe: with the node index synced, 'nodes refresh' read the index alone and
    reported a cell whose database was gone as answering ('did not answer: none')."""
    synced = cli("index", "sync", "--type", "node")
    assert synced.exit_code == 0, synced.output
    (tmp_path / "west.db").rename(tmp_path / "west.gone")
    (tmp_path / "west.db").mkdir()  # unopenable: a directory where the file was
    refreshed = cli("nodes", "refresh")
    assert refreshed.exit_code == 0, refreshed.output
    assert refreshed.output.startswith("2 nodes from cells")  # west's one from the index
    assert "cells that did not answer: west" in refreshed.output
