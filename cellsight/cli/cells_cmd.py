"""``cellsight cells …``: register, list and seed cell databases."""

from __future__ import annotations

import json
import uuid as uuidlib
from contextlib import ExitStack
from typing import TYPE_CHECKING, Annotated

import typer

from cellsight.cli.bounds import INT_MAX, MAX_CELLS, MAX_CHUNK, MAX_INSTANCES
from cellsight.cli.context import (
    canonical_uuid,
    console,
    fail,
    open_registry,
    operations,
    print_table,
    settings_of,
)
from cellsight.notifications.errors import plural

if TYPE_CHECKING:
    from cellsight.cells.mappings import CellRegistry

CellName = Annotated[str, typer.Option("--cell", help="Cell name or uuid")]
HostName = Annotated[str, typer.Option("--host", help="Compute host name")]

app = typer.Typer(
    name="cells",
    help="The cell databases: register, list, disable, remove, seed.",
    no_args_is_help=True,
)


def _registered(registry: CellRegistry, uuid: str) -> bool:
    return any(cell.uuid == uuid for cell in registry.list_cells())


def _check_sqlite_directory(db_url: str, create: bool) -> None:
    """A SQLite path in a directory that does not exist is a typo more often than not."""
    from cellsight.cells.database import missing_directory
    from cellsight.cells.errors import BadDatabaseURL

    try:
        parent = missing_directory(db_url)
    except BadDatabaseURL as exc:
        fail(f"--db-url: {exc.message}")  # its message masks the password
    if parent is not None and not create:
        fail(f"--db-url {db_url}: directory {parent} does not exist (--create makes it)")


@app.command("add")
def add(
    ctx: typer.Context,
    name: Annotated[str, typer.Option("--name", help="Unique cell name")],
    db_url: Annotated[str, typer.Option("--db-url", help="sqlite:///…, postgresql://…, mysql://…")],
    uuid: Annotated[
        str | None,
        typer.Option("--uuid", help="Cell uuid (default: a new one)", callback=canonical_uuid),
    ] = None,
    create: Annotated[
        bool, typer.Option("--create", help="Create a SQLite file's missing directory")
    ] = False,
) -> None:
    """Register a cell: its database must be reachable; its tables are created."""
    if not name.strip():
        fail("--name: a cell needs a non-empty name")
    from cellsight.cells.database import connect
    from cellsight.cells.errors import DuplicateCell
    from cellsight.cells.reads import count_instances
    from cellsight.cli.index_marks import index_held, unmark_all
    from cellsight.cli.interrupts import terminate_as_interrupt
    from cellsight.signal_events import signals_held

    _check_sqlite_directory(db_url, create)
    leaves = "its listings miss the new cell's instances"
    with (
        terminate_as_interrupt(),
        open_registry(ctx, make=True) as registry,
        index_held(settings_of(ctx), "cell registration", leaves) as engine,
    ):
        # Known before: an interrupt as ``add_cell`` returns still finds what to undo.
        fresh = uuid is None or not _registered(registry, uuid)
        uuid = uuid or str(uuidlib.uuid4())
        try:
            cell = registry.add_cell(name, db_url, uuid=uuid)
            # An existing database's instances were never notified: the index lacks them.
            with connect(registry.cell_engine(cell)) as conn:
                held = count_instances(conn)
            if held:
                why = f"cell {cell.name} ({cell.uuid}) added with {held} instances"
                unmark_all(engine, why, leaves)
        except BaseException as exc:
            # Not registered after all: interrupted (an interrupt probe), or the count
            # failed, registered with the index still marked synced, its listings would
            # have missed the cell's instances with no word of it. Not a uuid registered
            # before, nor one another command took meanwhile (refused as a duplicate).
            if fresh and not isinstance(exc, DuplicateCell):
                with signals_held():
                    registry.unregister(uuid, name)
            raise
    console.print(
        f"added cell {cell.name} {cell.uuid} ({cell.safe_url})", highlight=False, soft_wrap=True
    )


@app.command("list")
def list_cells(
    ctx: typer.Context,
    counts: Annotated[bool, typer.Option("--counts", help="Count each cell's instances")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON, one object a cell")] = False,
) -> None:
    """The registered cells (database passwords masked)."""
    from rich.markup import escape
    from rich.table import Table

    from cellsight.cells.database import connect
    from cellsight.cells.errors import CellsError
    from cellsight.cells.reads import count_instances

    listed: list[dict[str, object]] = []
    with open_registry(ctx) as registry:
        for cell in registry.list_cells():
            entry: dict[str, object] = {
                "name": cell.name, "uuid": cell.uuid, "database": cell.safe_url,
                "disabled": cell.disabled,
            }  # fmt: skip
            if counts:
                try:
                    with connect(registry.cell_engine(cell)) as conn:
                        entry["instances"] = count_instances(conn)
                except CellsError as exc:
                    entry["instances"] = None
                    entry["error"] = f"unavailable: {exc.message}"
            listed.append(entry)
    if as_json:
        print(json.dumps(listed, indent=2))
        return
    table = Table("name", "uuid", "database", "disabled", *(["instances"] if counts else []))
    for entry in listed:
        extra = [str(entry.get("error") or entry["instances"])] if counts else []
        cells = [entry["name"], entry["uuid"], entry["database"], entry["disabled"], *extra]
        table.add_row(*(escape(str(value)) for value in cells))
    print_table(table)


@app.command("disable")
def disable(
    ctx: typer.Context, cell: Annotated[str, typer.Argument(help="Cell name or uuid")]
) -> None:
    """Place no new instances in the cell (the scheduler and reservations skip it); its
    instances are listed and changed as before, as Nova's ``update_cell --disable``."""
    with open_registry(ctx) as registry:
        done = registry.set_disabled(cell, True)
    console.print(f"disabled cell {done.name} {done.uuid}", highlight=False, soft_wrap=True)


@app.command("enable")
def enable(
    ctx: typer.Context, cell: Annotated[str, typer.Argument(help="Cell name or uuid")]
) -> None:
    """Place instances in the cell again."""
    with open_registry(ctx) as registry:
        done = registry.set_disabled(cell, False)
    console.print(f"enabled cell {done.name} {done.uuid}", highlight=False, soft_wrap=True)


@app.command("remove")
def remove(
    ctx: typer.Context,
    cell: Annotated[str, typer.Argument(help="Cell name or uuid")],
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Remove it with its compute nodes and deleted instances' mappings"
        ),
    ] = False,
    skip_database_check: Annotated[
        bool,
        typer.Option(
            "--skip-database-check",
            help="Its database is gone for good: remove it unread, unmapping every "
            "instance mapped to it, living or not",
        ),
    ] = False,
) -> None:
    """Unregister a disabled cell, as Nova's ``delete_cell``: never while it holds
    instances that are not deleted. Its database is left as it is; `index sync` (both
    types) drops what the index holds of it."""
    from cellsight.cli.cell_removal import remove_unsynced
    from cellsight.cli.interrupts import terminate_as_interrupt

    with terminate_as_interrupt(), open_registry(ctx) as registry:
        done = remove_unsynced(
            settings_of(ctx), registry, cell, force=force, skip_database_check=skip_database_check
        )
    left = f"; {done.nodes} compute nodes left in its database" if done.nodes else ""
    console.print(
        f"removed cell {done.cell.name} {done.cell.uuid} and {done.mappings} instance "
        f"mappings{left}; the API lists by fan-out until `cellsight index sync --type "
        "instance` and `--type node` drop what the index holds of it",
        highlight=False,
        soft_wrap=True,
    )


@app.command("add-host")
def add_host(
    ctx: typer.Context,
    cell: CellName,
    host: HostName,
    vcpus: Annotated[int, typer.Option(min=1, max=INT_MAX, help="Virtual CPUs")] = 64,
    memory_mb: Annotated[
        int, typer.Option("--memory-mb", min=1, max=INT_MAX, help="Memory, MiB")
    ] = 262_144,
    disk_gb: Annotated[
        int, typer.Option("--disk-gb", min=1, max=INT_MAX, help="Local disk, GiB")
    ] = 4_000,
    availability_zone: Annotated[str, typer.Option("--az", help="Availability zone")] = "nova",
) -> None:
    """Register a compute node in a cell, for the scheduler to place instances on (its
    ``compute_node.update`` goes through the cell's outbox, as every operation's)."""
    from cellsight.cells.nodeevents import register_node

    if not host.strip():
        fail("--host: a compute node needs a non-empty host name")
    with operations(ctx) as ops:
        node = register_node(  # an unreachable cell: CellUnavailable names it
            ops,
            cell,
            host,
            vcpus=vcpus,
            memory_mb=memory_mb,
            local_gb=disk_gb,
            availability_zone=availability_zone,
        )
    console.print(
        f"added host {host} ({node.uuid}) to cell {cell}", highlight=False, soft_wrap=True
    )


@app.command("set-host")
def set_host(
    ctx: typer.Context,
    cell: CellName,
    host: HostName,
    disabled: Annotated[
        bool | None,
        typer.Option("--disable/--enable", help="Take no new instances (the scheduler skips it)"),
    ] = None,
    offline: Annotated[
        bool | None,
        typer.Option("--offline/--online", help="Its live state cannot be read"),
    ] = None,
) -> None:
    """Disable or enable a compute host, or mark it offline or online (as Nova's
    ``compute service set``); its ``compute_node.update`` goes through the outbox."""
    from cellsight.cells.nodeevents import set_node_state

    if disabled is None and offline is None:
        raise typer.BadParameter("give --disable, --enable, --offline or --online")
    with operations(ctx) as ops:
        nodes = set_node_state(ops, cell, host, disabled=disabled, offline=offline)
    for node in nodes:
        console.print(
            f"host {host} ({node.uuid}) in cell {cell}: disabled={node.disabled} "
            f"offline={node.offline}",
            highlight=False,
            soft_wrap=True,
        )


@app.command("seed")
def seed(
    ctx: typer.Context,
    cells: Annotated[
        int, typer.Option("--cells", min=1, max=MAX_CELLS, help="How many new cells")
    ] = 1,
    instances: Annotated[
        int, typer.Option("--instances", min=0, max=MAX_INSTANCES, help="Instances per cell")
    ] = 1000,
    db_url: Annotated[
        list[str] | None,
        typer.Option("--db-url", help="One per cell (default: SQLite files in the data dir)"),
    ] = None,
    seed_value: Annotated[int, typer.Option("--seed", help="Same seed, same data")] = 0,
    chunk_size: Annotated[
        int, typer.Option("--chunk-size", min=1, max=MAX_CHUNK, help="Rows per insert")
    ] = 10_000,
    notify: Annotated[
        bool, typer.Option("--notify", help="Publish instance.create.end for every instance")
    ] = False,
    create: Annotated[
        bool, typer.Option("--create", help="Create a --db-url SQLite file's missing directory")
    ] = False,
) -> None:
    """Create new cells filled with a realistic spread of instances, fast."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from cellsight.cells.seed import seed as seed_cells
    from cellsight.cli.interrupts import terminate_as_interrupt

    if db_url and len(db_url) != cells:
        fail(
            f"--db-url: {len(db_url)} given for --cells {cells}; give one per cell "
            "(or none: SQLite files in the data directory)"
        )
    for url in db_url or ():
        _check_sqlite_directory(url, create)
    from cellsight.cli.index_marks import index_held, unmark_all

    settings = settings_of(ctx)
    leaves = "its listings miss the seeded instances"
    with (
        terminate_as_interrupt(),
        open_registry(ctx, make=True) as registry,
        index_held(settings, "cell seeding", leaves) as engine,
        ExitStack() as stack,
    ):
        publisher = None
        if notify:
            from cellsight.clients import build_notifier  # the bus is only needed here

            publisher = stack.enter_context(build_notifier(settings))
        progress = stack.enter_context(
            Progress(
                TextColumn("seeding"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console,
                transient=True,
            )
        )
        task = progress.add_task("seed", total=cells * instances)
        if not notify:
            # Before the cells exist: interrupted after seeding, before the mark, the
            # index said synced without their instances (an interrupt probe). A seed
            # that fails leaves it unsynced until the next sync: listings fan out.
            unmark_all(engine, f"{plural(cells, 'cell')} seeded without notifications", leaves)
        report = seed_cells(
            registry,
            cells=cells,
            instances_per_cell=instances,
            cells_dir=settings.cells_dir,
            db_urls=db_url or (),
            seed=seed_value,
            chunk_size=chunk_size,
            progress=lambda n: progress.advance(task, n),
            publisher=publisher,
            publisher_id=settings.publisher_id,
        )
        names = ", ".join(c.name for c in report.cells)
    notified = f", {report.notifications} notifications" if notify else ""
    # Every instance's notification went into its cell's outbox with the row.
    by_another = report.instances - report.notifications - report.waiting if notify else 0
    if by_another > 0:
        notified += f" ({by_another} more published by another relay)"
    if report.waiting:
        notified += (
            f" ({report.waiting} more wait in the cells' outboxes: the relay, "
            "`cellsight outbox relay` or an indexer's, publishes them)"
        )
    console.print(
        f"seeded {plural(len(report.cells), 'cell')} ({names}): {report.instances} instances, "
        f"{report.compute_nodes} compute nodes{notified} in {report.seconds:.2f} s "
        f"({report.rows_per_s:,.0f} rows/s)",
        highlight=False,
        soft_wrap=True,
    )
