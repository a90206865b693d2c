"""``cellsight ops reserve|modify|rename|commit|cancel`` on the embedded defaults."""

from __future__ import annotations

from pathlib import Path

from cellsight.cells.database import connect
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.reads import get_instance
from cellsight.settings import load_settings
from tests.cells.test_cells_cli import UUID, Invoke, cli, one_line

__all__ = ["cli"]


def test_reservation_workflow_from_the_cli(cli: Invoke, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'east.db'}"
    assert cli("cells", "add", "--name", "east", "--db-url", url).exit_code == 0
    assert cli("cells", "add-host", "--cell", "east", "--host", "h1").exit_code == 0
    made = cli("ops", "reserve")
    assert made.exit_code == 0, made.output
    (uuid,) = UUID.findall(made.output)[:1]
    assert f"{uuid} (no name) state=building power=pending host=- " in one_line(made.output)
    refused = cli("ops", "commit", uuid)
    assert refused.exit_code == 1  # a refused operation (exit codes: cellsight.cli.errors)
    assert one_line(refused.output) == (
        f"error: reservation {uuid} cannot be committed without --name --project --user "
        f"--flavor --host (`cellsight ops modify {uuid} --name … --project … --user … "
        "--flavor … --host …` first)"
    )
    changed = cli("ops", "modify", uuid, "--project", "p", "--user", "u", "--flavor", "m1.small")
    assert changed.exit_code == 0, changed.output
    assert cli("ops", "modify", uuid, "--host", "h1").exit_code == 0
    assert cli("ops", "rename", uuid, "web").exit_code == 0
    built = cli("ops", "commit", uuid)
    assert built.exit_code == 0, built.output
    assert "state=active" in built.output and "host=h1" in built.output
    nothing = cli("ops", "modify", uuid)
    assert nothing.exit_code == 2
    gone = cli("ops", "cancel", uuid)
    assert gone.exit_code == 1 and "is not a reservation" in one_line(gone.output)
    other = UUID.findall(cli("ops", "reserve", "--flavor", "m1.tiny").output)[0]
    assert cli("ops", "cancel", other).exit_code == 0
    settings = load_settings(data_dir=tmp_path / "data")
    registry = CellRegistry(settings.resolved_api_db_url)
    try:
        cell = registry.locate(uuid)
        with connect(registry.cell_engine(cell)) as conn:
            row = get_instance(conn, uuid)
            cancelled = get_instance(conn, other)
        assert row is not None and (row["display_name"], row["forthcoming"]) == ("web", False)
        assert cancelled is not None and cancelled["deleted"]
    finally:
        registry.close()


def test_names_holding_control_characters_are_usage_errors(cli: Invoke, tmp_path: Path) -> None:
    """Nova's name pattern refuses control characters and line or paragraph separators:
    ``ops reserve|modify`` and ``ops rename`` (of a reservation or an instance) say which
    character, on one line, exit 2, and change nothing; a space is fine."""
    url = f"sqlite:///{tmp_path / 'east.db'}"
    assert cli("cells", "add", "--name", "east", "--db-url", url).exit_code == 0
    assert cli("cells", "add-host", "--cell", "east", "--host", "h1").exit_code == 0
    uuid = UUID.findall(cli("ops", "reserve", "--name", "web 1\u00a0a").output)[0]
    for bad, shown in (("a\x01b", "U+0001"), ("a\x7f", "U+007F"), ("a\u2028b", "U+2028")):
        for args in (
            ("ops", "reserve", "--name", bad),
            ("ops", "modify", uuid, "--project", bad),
            ("ops", "rename", uuid, bad),
        ):
            refused = cli(*args)
            assert refused.exit_code == 2, (args, refused.output)
            assert shown in one_line(refused.output), refused.output
    settings = load_settings(data_dir=tmp_path / "data")
    registry = CellRegistry(settings.resolved_api_db_url)
    try:
        with connect(registry.cell_engine(registry.locate(uuid))) as conn:
            row = get_instance(conn, uuid)
        assert row is not None and (row["display_name"], row["project_id"]) == (
            "web 1\u00a0a",
            None,
        )
    finally:
        registry.close()


def test_cells_hosts_and_boots_refuse_what_names_may_not_hold(cli: Invoke, tmp_path: Path) -> None:
    """A cell or host name with a terminal escape was registered, then printed raw by
    every error listing the cells; a boot took it in its project. Each is a usage error
    naming the character, and over-long reservation values are refused as the API does."""
    url = f"sqlite:///{tmp_path / 'east.db'}"
    bad_cell = cli("cells", "add", "--name", "ev\x1b[2Jil", "--db-url", url)
    assert bad_cell.exit_code == 2 and "U+001B" in one_line(bad_cell.output), bad_cell.output
    assert cli("cells", "add", "--name", "east", "--db-url", url).exit_code == 0
    bad_host = cli("cells", "add-host", "--cell", "east", "--host", "h\x1b]0;x\x07")
    assert bad_host.exit_code == 2 and "U+001B" in one_line(bad_host.output), bad_host.output
    empty = cli("cells", "add-host", "--cell", "east", "--host", " ")
    assert empty.exit_code == 2 and "--host" in one_line(empty.output), empty.output
    assert cli("cells", "add-host", "--cell", "east", "--host", "h1").exit_code == 0
    boot = ("ops", "boot", "--name", "web", "--flavor", "m1.small", "--user", "u")
    bad_boot = cli(*boot, "--project", "p\x1b[31m")
    assert bad_boot.exit_code == 2 and "U+001B" in one_line(bad_boot.output), bad_boot.output
    for option in ("--host", "--flavor", "--cell"):
        long = cli("ops", "reserve", option, "x" * 300)
        assert long.exit_code == 2 and "at most 255" in one_line(long.output), long.output
    assert "\x1b" not in cli("cells", "list").output


def test_every_uuid_spelling_the_api_reads_the_cli_reads(cli: Invoke, tmp_path: Path) -> None:
    """Found from outside: the README says a uuid may be spelt as ``uuid.UUID`` reads it
    on both the CLI and HTTP; ``ops modify|commit|cancel|show`` said "not found in the
    instance mappings" (exit 2) of an existing reservation spelt otherwise."""
    url = f"sqlite:///{tmp_path / 'east.db'}"
    assert cli("cells", "add", "--name", "east", "--db-url", url).exit_code == 0
    assert cli("cells", "add-host", "--cell", "east", "--host", "h1").exit_code == 0
    uuid = UUID.findall(cli("ops", "reserve", "--flavor", "m1.tiny").output)[0]
    for n, spelt in enumerate(
        (uuid.upper(), "{" + uuid + "}", "urn:uuid:" + uuid, uuid.replace("-", ""))
    ):
        changed = cli("ops", "modify", spelt, "--name", f"web-{n}")
        assert changed.exit_code == 0, changed.output
        shown = cli("ops", "show", spelt)
        assert shown.exit_code == 0 and f'"web-{n}"' in shown.output, shown.output
    assert cli("ops", "cancel", uuid.upper()).exit_code == 0
    bad = cli("ops", "cancel", "not-a-uuid")
    assert bad.exit_code == 2 and "not a UUID: 'not-a-uuid'" in one_line(bad.output)


def test_a_host_lives_in_one_cell(cli: Invoke, tmp_path: Path) -> None:
    """Found from outside: ``add-host`` took a host name another cell held, and then a
    reservation ``--host`` found the first (full) one and refused (Nova's host mappings
    keep a host in one cell)."""
    for name in ("east", "west"):
        url = f"sqlite:///{tmp_path / f'{name}.db'}"
        assert cli("cells", "add", "--name", name, "--db-url", url).exit_code == 0
    assert cli("cells", "add-host", "--cell", "east", "--host", "h1").exit_code == 0
    again = cli("cells", "add-host", "--cell", "west", "--host", "h1")
    assert again.exit_code == 2  # a name already taken (exit codes: cellsight.cli.errors)
    assert "compute node h1/h1 is already registered in cell east" in one_line(again.output)
    twice = cli("cells", "add-host", "--cell", "east", "--host", "h1")
    assert twice.exit_code == 2 and "in this cell" in one_line(twice.output)
    assert cli("cells", "add-host", "--cell", "west", "--host", "h2").exit_code == 0
