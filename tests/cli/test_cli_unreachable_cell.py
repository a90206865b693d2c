"""Found from outside: a registered cell whose server database went away (dropped, or
its server down) ended ``outbox status`` at that cell with the driver's exception class
and a hint about missing tables, and ``cells add-host`` named the database but not the
cell asked for. The outbox's tables are now made through the same connection helper as
every other read of a cell, so such a cell is unavailable and named, and the others are
still listed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from cellsight.cli.errors import RUNTIME
from tests.cli.test_cli_errors import assert_one_line_error, cellsight
from tests.support.services import create_database, drop_database, server_fixture

pytestmark = pytest.mark.services


@pytest.fixture(params=["postgresql", "mariadb"])
def gone_cell(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A data directory with a SQLite cell ``here`` and a server cell ``gone`` whose
    database was dropped after it was registered."""
    server: sa.URL = request.getfixturevalue(server_fixture(request.param))
    name, url = create_database(server)
    data = tmp_path / "data"
    try:
        for cell, db_url in (("here", f"sqlite:///{tmp_path / 'here.db'}"), ("gone", url)):
            added = cellsight(data, "cells", "add", "--name", cell, "--db-url", db_url)
            assert added.returncode == 0, added.stderr
    finally:
        drop_database(server, name)
    yield data


def test_outbox_status_names_the_unavailable_cell_and_lists_the_others(gone_cell: Path) -> None:
    result = cellsight(gone_cell, "outbox", "status")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "here: 0" in lines, lines
    (gone,) = [line for line in lines if line.startswith("gone: ")]
    assert gone.startswith("gone: unavailable: database "), gone
    assert "is unavailable" in gone
    assert "OperationalError" not in result.stdout + result.stderr
    assert "missing table" not in result.stdout + result.stderr


def test_outbox_relay_does_not_count_what_it_could_not_reach(gone_cell: Path) -> None:
    # It said "gone: published 0, 0 left": nothing was counted there.
    result = cellsight(gone_cell, "outbox", "relay", "--no-wait")
    assert result.returncode == RUNTIME, result.stderr
    lines = result.stdout.splitlines()
    assert "here: published 0, 0 left" in lines, lines
    (gone,) = [line for line in lines if line.startswith("gone: ")]
    assert gone.startswith("gone: published 0, left unknown: cell gone: database "), gone


@pytest.mark.parametrize(
    "command",
    [
        ["cells", "add-host", "--cell", "gone", "--host", "h9"],
        ["ops", "boot", "--name", "b", "--flavor", "m1.tiny", "--project", "p", "--user", "u",
         "--cell", "gone"],
        ["ops", "reserve", "--cell", "gone"],
    ],
)  # fmt: skip
def test_what_needs_the_unavailable_cell_names_the_cell(
    gone_cell: Path, command: list[str]
) -> None:
    result = cellsight(gone_cell, *command)
    err = assert_one_line_error(result, RUNTIME, "error: cell gone: database ", "is unavailable")
    assert "OperationalError" not in err


def test_add_host_in_the_cell_that_answers_still_works(gone_cell: Path) -> None:
    here = cellsight(gone_cell, "cells", "add-host", "--cell", "here", "--host", "h1")
    assert here.returncode == 0, here.stderr
