"""A sync that fails, is interrupted or is killed leaves the old index serving and the
write alias as it was; its index is gone (at once, or at the next sync's clean-up); and
the next sync succeeds. A transient engine failure once does not fail it (retried;
``test_sync_retries`` has the bulk writes' own)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cellsight.cells.errors import UnreadableRow
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.schema import instances
from cellsight.clients import build_engine
from cellsight.indexer.cell_streams import CellDocs, Scope
from cellsight.indexer.engines.base import EngineRejected, EngineUnavailable, SearchEngine
from cellsight.indexer.index_roles import layout, marker_key
from cellsight.indexer.sync import SyncFailed, SyncInterrupted, SyncOptions, run_sync
from cellsight.indexer.verify import Verifier
from tests.support.sync_progress import AfterBatches
from tests.support.sync_world import World, seeded_settings

ROOT = Path(__file__).resolve().parents[2]


def _after(n: int, exc: BaseException, stream: Iterator[Any], seen: list[int]) -> Iterator[Any]:
    """``stream``, raising ``exc`` at its overall ``n``-th item (counted in ``seen``)."""
    for item in stream:
        seen[0] += 1
        if seen[0] > n:
            raise exc
        yield item


def _break(
    engine: SearchEngine, point: str, exc: BaseException, *, once: bool = False
) -> Callable[[], int]:
    """Make ``point`` fail (``once``: its first call only, not the retries); returns the
    undo, which says how many times it failed (``load`` not counted)."""
    names = {
        "create": "create_index",
        "aliases": "set_aliases",
        "load": "bulk_index",
        "finish": "finish_bulk_load",
        "count": "count",  # of the new index (``index=``), not of the live one
        "swap": "set_aliases",
    }
    name = names[point]
    original = getattr(engine, name)
    calls, items, fired = [0], [0], [0]

    def broken(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if point == "load":  # part of the documents written, then the failure
            return _after(5, exc, original(*args, **kwargs), items)
        if point == "count" and kwargs.get("index") is None:
            return original(*args, **kwargs)
        if point in ("aliases", "swap") and calls[0] != (1 if point == "aliases" else 2):
            return original(*args, **kwargs)  # 1: write alias on both, 2: the swap
        if once and fired[0]:
            return original(*args, **kwargs)
        fired[0] += 1
        raise exc

    def undo() -> int:
        setattr(engine, name, original)
        return fired[0]

    setattr(engine, name, broken)
    return undo


def _serving(world: World) -> tuple[str, list[str], set[str]]:
    current = layout(world.engine, "instance")
    assert current.serving is not None
    names = {i.name for i in world.engine.indexes("instance")}
    return current.serving.name, current.writers, names


POINTS = ["create", "aliases", "load", "finish", "count", "swap"]


@pytest.mark.parametrize("point", POINTS)
def test_a_failure_leaves_the_old_index_serving(make_world: Any, point: str) -> None:
    world: World = make_world("sqlite", "embedded")
    run_sync(world.engine, world.registry, SyncOptions(keep_old=0))
    before = _serving(world)
    marker = world.engine.get_meta(marker_key("instance"))
    # Not transient: not retried (a transient one is, below).
    undo = _break(world.engine, point, EngineRejected(f"injected at {point}"))
    with pytest.raises(SyncFailed) as failed:
        run_sync(world.engine, world.registry, SyncOptions(batch_size=3))
    undo()
    assert f"injected at {point}" in str(failed.value)
    assert f"{before[0]} still serves" in str(failed.value)
    assert _serving(world) == before  # same read, same write alias, no other index
    assert world.engine.get_meta(marker_key("instance")) == marker
    world.assert_index_equals_cells()
    report = run_sync(world.engine, world.registry, SyncOptions())  # the lock was released
    assert report.cleaned_up == []
    world.assert_index_equals_cells()


@pytest.mark.parametrize("point", [p for p in POINTS if p != "load"])
def test_a_transient_failure_once_is_retried_except_the_create(make_world: Any, point: str) -> None:
    """Every step from the write alias change to the swap can run twice; the create is
    not retried (one that timed out may have created the index), failing early, before
    anything was loaded."""
    world: World = make_world("sqlite", "embedded")
    run_sync(world.engine, world.registry, SyncOptions(keep_old=0))
    before = _serving(world)
    undo = _break(world.engine, point, EngineUnavailable(f"injected at {point}"), once=True)
    options = SyncOptions(batch_size=3, retry_backoff=0.001)
    try:
        if point == "create":
            with pytest.raises(SyncFailed, match="injected at create"):
                run_sync(world.engine, world.registry, options)
            assert _serving(world) == before
        else:
            report = run_sync(world.engine, world.registry, options)
            assert _serving(world)[0] == report.index != before[0]
    finally:
        fired = undo()
    assert fired == 1
    world.assert_index_equals_cells()


def _ctrl_c() -> None:
    raise KeyboardInterrupt


def test_ctrl_c_cleans_up_like_a_failure(make_world: Any, engine_kind: str) -> None:
    world: World = make_world("sqlite", engine_kind)
    run_sync(world.engine, world.registry, SyncOptions())
    before = _serving(world)
    with pytest.raises(SyncInterrupted, match="interrupted"):
        run_sync(
            world.engine,
            world.registry,
            SyncOptions(batch_size=3),
            progress=AfterBatches(3, _ctrl_c),
        )
    assert _serving(world) == before
    run_sync(world.engine, world.registry, SyncOptions())
    world.assert_index_equals_cells()


def _cli(data_dir: Path, *args: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-c", "from cellsight.cli import main; main()"]
    return subprocess.Popen(
        [*command, "--data-dir", str(data_dir), "index", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: it and its workers, stopped as one
    )


def _step_until(victim: subprocess.Popen[bytes], reached: Callable[[], bool]) -> None:
    """Let ``victim`` (and its worker processes) run in slices of a few milliseconds,
    stopped (SIGSTOP) between them, until ``reached()``, read while it is stopped, holds.
    Polling a process that runs freely raced it: under load the sync finished between
    two polls (seen in CI). Stopped, it cannot pass the point; it is left stopped."""
    group = victim.pid  # its own session's leader
    deadline = time.monotonic() + 120
    os.killpg(group, signal.SIGSTOP)
    while not reached():
        assert victim.poll() is None, "the sync ended before it could be killed"
        assert time.monotonic() < deadline, "the sync made no progress"
        os.killpg(group, signal.SIGCONT)
        time.sleep(random.uniform(0.001, 0.004))  # a slice of its run, at a random length
        os.killpg(group, signal.SIGSTOP)


def test_a_sync_killed_at_a_random_point_leaves_the_old_index_serving(tmp_path: Path) -> None:
    settings = seeded_settings(tmp_path / "data", instances_per_cell=1500)
    registry = CellRegistry.from_settings(settings)
    first = _cli(settings.data_dir, "sync")
    assert first.wait(120) == 0, first.stderr.read() if first.stderr else ""
    engine = build_engine(settings)
    world = World(registry, engine, "sqlite", registry.list_cells())
    old = layout(engine, "instance").serving
    assert old is not None
    victim = _cli(settings.data_dir, "sync", "--batch-size", "20")
    # Kill it at a random point of its load: once its new index holds a random share of
    # the 3,000 documents (a point in progress, not in time: a faster engine must not
    # let the sync finish first).
    # It is killed where it was stopped (mid-batch, mid-commit or between batches), with
    # its worker processes, as systemd's stop kills a unit's whole group.
    target = random.randint(1, 2400)
    _step_until(victim, lambda: sum(i.docs for i in layout(engine, "instance").stray) >= target)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(10)
    after = layout(engine, "instance")
    assert after.serving is not None and after.serving.name == old.name  # still serving
    assert len(after.stray) == 1  # left behind: no process survived to clean it up
    world.assert_index_equals_cells()
    # The next sync takes over the dead sync's lock at once and removes its index.
    report = run_sync(engine, registry, SyncOptions(keep_old=0))
    assert report.cleaned_up == [after.stray[0].name]
    final = layout(engine, "instance")
    assert final.stray == [] and final.retired == []
    assert [i.name for i in engine.indexes("instance")] == [report.index]
    world.assert_index_equals_cells()
    engine.close()
    registry.close()


@pytest.mark.parametrize(
    ("column", "value"), [("metadata", '{"a": 1}'), ("tags", "[1, 2]"), ("progress", 1.5)]
)
def test_a_row_that_does_not_read_fails_the_sync_naming_it(
    make_world: Any, column: str, value: object
) -> None:
    """A cell row written by other means that the payload model refuses (an adversarial
    probe wrote them with plain SQL): the sync fails, the old index still serves, and
    the error names the row, where it named only the model's complaint."""
    import sqlalchemy as sa

    world: World = make_world("sqlite", "embedded")
    run_sync(world.engine, world.registry, SyncOptions(keep_old=0))
    before = _serving(world)
    cell = world.registry.list_cells()[0]
    victim = next(iter(world.revisions(cell)))
    with world.registry.cell_engine(cell).begin() as conn:
        conn.execute(
            sa.text(f"UPDATE instances SET {column} = :value WHERE uuid = :uuid"),
            {"value": value, "uuid": victim},
        )
    with pytest.raises(SyncFailed) as failed:
        run_sync(world.engine, world.registry, SyncOptions())
    assert f"instance row {victim!r} does not read as an instance" in str(failed.value)
    # The model's first refusal by its field and value, not its "3 validation errors".
    assert f"field {column}" in str(failed.value) and "validation error" not in str(failed.value)
    assert f"{before[0]} still serves" in str(failed.value)
    assert _serving(world) == before


@pytest.mark.services
@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("launched_at", "'infinity'"),  # no Python datetime: the driver fails the fetch
        ("metadata", '\'{"a": ' + "9" * 5000 + "}'"),  # past int()'s 4,300 digits
    ],
)
def test_a_value_the_driver_cannot_read_fails_the_sync_naming_row_and_column(
    make_world: Any, column: str, value: str
) -> None:
    """PostgreSQL's driver converts timestamps and JSON while it fetches a page, so such a
    value failed the whole page, named by neither its row nor its column."""
    import sqlalchemy as sa

    world: World = make_world("postgresql", "embedded", cells=1)
    run_sync(world.engine, world.registry, SyncOptions(keep_old=0))
    before = _serving(world)
    cell = world.registry.list_cells()[0]
    victim = sorted(world.revisions(cell))[7]
    with world.registry.cell_engine(cell).begin() as conn:
        conn.execute(
            sa.text(
                f"UPDATE instances SET {column} = {value}, revision = revision + 1 "
                "WHERE uuid = :uuid"
            ),
            {"uuid": victim},
        )
    with pytest.raises(SyncFailed) as failed:
        run_sync(world.engine, world.registry, SyncOptions(batch_size=5))
    assert f"instance row {victim!r} does not read as an instance" in str(failed.value)
    assert f"column {column}:" in str(failed.value)
    # Found at the cost of about a statement a row and one a column, not their product
    # (a page of 1,000 took 49,979 statements when every row was read column by column).
    engine = world.registry.cell_engine(cell)
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    docs = CellDocs(Scope("instance"), cell.uuid, "instance.update")
    with engine.connect() as conn, pytest.raises(UnreadableRow, match=column):
        for _ in docs.iter_batches(conn, 30):
            pass
    assert len(statements) <= 30 + 2 * len(instances.c), len(statements)
    assert _serving(world) == before
    # Its repair reads the row whole: the same row and column named.
    report = Verifier(world.engine, world.registry, "instance", repair=True).run([cell])
    (failed_cell,) = report.failed_cells
    assert failed_cell.failed is not None
    assert victim in failed_cell.failed and f"column {column}:" in failed_cell.failed


def test_a_revision_that_is_no_integer_fails_verify_naming_the_row(make_world: Any) -> None:
    import sqlalchemy as sa

    world: World = make_world("sqlite", "embedded", cells=1)
    run_sync(world.engine, world.registry, SyncOptions(keep_old=0))
    cell = world.registry.list_cells()[0]
    victim = sorted(world.revisions(cell))[3]
    with world.registry.cell_engine(cell).begin() as conn:
        conn.execute(
            sa.text("UPDATE instances SET revision = 'abc' WHERE uuid = :uuid"), {"uuid": victim}
        )
    report = Verifier(world.engine, world.registry, "instance").run([cell])
    (failed_cell,) = report.failed_cells
    assert failed_cell.failed is not None
    assert victim in failed_cell.failed and "revision 'abc' is not an integer" in failed_cell.failed


def test_a_cell_that_fails_its_query_fails_the_sync_in_one_line(make_world: Any) -> None:
    """An adversarial probe dropped a column of a cell's table: the sync's error quoted
    SQLAlchemy's whole text, the statement and its parameters over eight lines."""
    import sqlalchemy as sa

    world: World = make_world("sqlite", "embedded", cells=1)
    run_sync(world.engine, world.registry, SyncOptions(keep_old=0))
    before = _serving(world)
    cell = world.registry.list_cells()[0]
    with world.registry.cell_engine(cell).begin() as conn:
        conn.execute(sa.text("ALTER TABLE instances DROP COLUMN tags"))
    with pytest.raises(SyncFailed) as failed:
        run_sync(world.engine, world.registry, SyncOptions())
    message = str(failed.value)
    assert f"cell {cell.name}: OperationalError: no such column" in message
    assert "[SQL" not in message and "SELECT" not in message and "\n" not in message
    assert _serving(world) == before


def test_text_that_is_not_utf8_fails_the_sync_naming_row_and_column(make_world: Any) -> None:
    """SQLite stores any bytes as text; its driver cannot decode them and fails the page
    (an adversarial probe): the error now names the row and column, as for the values
    PostgreSQL's driver cannot convert."""
    import sqlalchemy as sa

    world: World = make_world("sqlite", "embedded", cells=1)
    run_sync(world.engine, world.registry, SyncOptions(keep_old=0))
    cell = world.registry.list_cells()[0]
    victim = sorted(world.revisions(cell))[4]
    with world.registry.cell_engine(cell).begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE instances SET display_name = CAST(X'C328FF' AS TEXT), "
                "revision = revision + 1 WHERE uuid = :uuid"
            ),
            {"uuid": victim},
        )
    with pytest.raises(SyncFailed) as failed:
        run_sync(world.engine, world.registry, SyncOptions(batch_size=7))
    assert f"instance row {victim!r} does not read as an instance" in str(failed.value)
    assert "column display_name:" in str(failed.value)


def test_a_failure_that_cannot_put_the_aliases_back_does_not_say_what_serves(
    make_world: Any,
) -> None:
    """An adversarial probe removed the index files under a sync: it said the old index
    "still serves; could not restore the aliases (index ... does not exist)"."""
    world: World = make_world("sqlite", "embedded")
    run_sync(world.engine, world.registry, SyncOptions(keep_old=0))
    undo_load = _break(world.engine, "load", EngineRejected("injected at load"))
    set_aliases, calls = world.engine.set_aliases, [0]

    def only_once(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] > 1:  # the first writes to both indexes; putting them back fails
            raise EngineRejected("injected: the aliases cannot be set")
        return set_aliases(*args, **kwargs)

    world.engine.set_aliases = only_once  # type: ignore[method-assign]
    with pytest.raises(SyncFailed) as failed:
        run_sync(world.engine, world.registry, SyncOptions(batch_size=3))
    world.engine.set_aliases = set_aliases  # type: ignore[method-assign]
    undo_load()
    message = str(failed.value)
    assert "could not restore the aliases" in message and "still serves" not in message
    run_sync(world.engine, world.registry, SyncOptions())  # the next sync cleans up
    world.assert_index_equals_cells()
