"""``cellsight cells …``: register, list and seed cell databases."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from cells.database import connect
from cells.errors import CellsError
from cells.mappings import CellRegistry
from cells.nodes import add_compute_node
from cells.reads import count_instances
from cells.seed import seed as seed_cells
from cellsight.cli.context import console, fail, settings_of
from notifications.errors import NotificationError

app = typer.Typer(
    name="cells", help="The cell databases: register, list, seed.", no_args_is_help=True
)


@contextmanager
def cli_errors() -> Iterator[None]:
    """Named errors and bad values become one clear line and exit code 2."""
    try:
        yield
    except (CellsError, NotificationError) as exc:
        fail(exc.message)
    except ValueError as exc:
        fail(str(exc))


@contextmanager
def open_registry(ctx: typer.Context) -> Iterator[CellRegistry]:
    with cli_errors():
        registry = CellRegistry.from_settings(settings_of(ctx))
    try:
        yield registry
    finally:
        registry.close()


@app.command("add")
def add(
    ctx: typer.Context,
    name: Annotated[str, typer.Option("--name", help="Unique cell name")],
    db_url: Annotated[str, typer.Option("--db-url", help="sqlite:///…, postgresql://…, mysql://…")],
    uuid: Annotated[str | None, typer.Option("--uuid", help="Cell uuid (default: new)")] = None,
) -> None:
    """Register a cell; its database is checked and its tables created."""
    with open_registry(ctx) as registry, cli_errors():
        cell = registry.add_cell(name, db_url, uuid=uuid)
    console.print(
        f"added cell {cell.name} {cell.uuid} ({cell.safe_url})", highlight=False, soft_wrap=True
    )


@app.command("list")
def list_cells(
    ctx: typer.Context,
    counts: Annotated[bool, typer.Option("--counts", help="Count each cell's instances")] = False,
) -> None:
    """The registered cells (database passwords masked)."""
    with open_registry(ctx) as registry, cli_errors():
        table = Table("name", "uuid", "database", "disabled", *(["instances"] if counts else []))
        for cell in registry.list_cells():
            extra: list[str] = []
            if counts:
                try:
                    with connect(registry.cell_engine(cell)) as conn:
                        extra = [str(count_instances(conn))]
                except CellsError as exc:
                    extra = [f"unavailable: {exc.message}"]
            table.add_row(cell.name, cell.uuid, cell.safe_url, str(cell.disabled), *extra)
    console.print(table)


@app.command("add-host")
def add_host(
    ctx: typer.Context,
    cell: Annotated[str, typer.Option("--cell", help="Cell name or uuid")],
    host: Annotated[str, typer.Option("--host", help="Compute host name")],
    vcpus: Annotated[int, typer.Option(min=1)] = 64,
    memory_mb: Annotated[int, typer.Option("--memory-mb", min=1)] = 262_144,
    disk_gb: Annotated[int, typer.Option("--disk-gb", min=1)] = 4_000,
    availability_zone: Annotated[str, typer.Option("--az")] = "nova",
) -> None:
    """Register a compute node in a cell, for the scheduler to place instances on."""
    with open_registry(ctx) as registry, cli_errors():
        row = add_compute_node(
            registry.cell_engine(cell),
            host,
            vcpus=vcpus,
            memory_mb=memory_mb,
            local_gb=disk_gb,
            availability_zone=availability_zone,
        )
    console.print(
        f"added host {host} ({row['uuid']}) to cell {cell}", highlight=False, soft_wrap=True
    )


@app.command("seed")
def seed(
    ctx: typer.Context,
    cells: Annotated[int, typer.Option("--cells", min=1, help="How many new cells")] = 1,
    instances: Annotated[int, typer.Option("--instances", min=0, help="Instances per cell")] = 1000,
    db_url: Annotated[
        list[str] | None, typer.Option("--db-url", help="One per cell (default: SQLite files)")
    ] = None,
    seed_value: Annotated[int, typer.Option("--seed", help="Same seed, same data")] = 0,
    chunk_size: Annotated[int, typer.Option("--chunk-size", min=1)] = 10_000,
    notify: Annotated[
        bool, typer.Option("--notify", help="Publish instance.create.end for every instance")
    ] = False,
) -> None:
    """Create new cells filled with a realistic spread of instances, fast."""
    settings = settings_of(ctx)
    with open_registry(ctx) as registry, ExitStack() as stack, cli_errors():
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
    console.print(
        f"seeded {len(report.cells)} cells ({names}): {report.instances} instances, "
        f"{report.compute_nodes} compute nodes{notified} in {report.seconds:.2f} s "
        f"({report.rows_per_s:,.0f} rows/s)",
        highlight=False,
        soft_wrap=True,
    )
