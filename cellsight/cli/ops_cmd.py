"""``cellsight ops …``: cluster operations on instances, notified on the bus."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from cellsight.cli.bounds import MAX_BOOT_COUNT
from cellsight.cli.context import canonical_uuid, console, fail, open_registry, operations

if TYPE_CHECKING:
    from cellsight.cells.operations import Operations
    from cellsight.notifications.payloads import InstancePayload

app = typer.Typer(
    name="ops", help="Cluster operations on instances (each one notified).", no_args_is_help=True
)

T = TypeVar("T")
Uuid = Annotated[str, typer.Argument(help="Instance uuid", callback=canonical_uuid)]


def _run(ctx: typer.Context, action: Callable[[Operations], T]) -> T:
    from cellsight.cli.interrupts import terminate_as_interrupt

    # SIGTERM as Ctrl-C: an operation undoes what it began (an interrupt probe: a boot
    # stopped by SIGTERM left its instance mapping without a row).
    with terminate_as_interrupt(), operations(ctx) as ops:
        return action(ops)


def _show(payload: InstancePayload) -> None:
    # A reservation may have no name or host yet: said so, not printed as ``None``.
    name = "(no name)" if payload.display_name is None else repr(payload.display_name)
    console.print(
        f"{payload.uuid} {name} state={payload.state} "
        f"power={payload.power_state} host={payload.host or '-'} revision={payload.revision}",
        highlight=False,
        soft_wrap=True,
    )


@app.command("boot")
def boot(
    ctx: typer.Context,
    name: Annotated[str, typer.Option("--name", help="Display name")],
    flavor: Annotated[str, typer.Option("--flavor", help="Flavor name, e.g. m1.small")],
    project: Annotated[str, typer.Option("--project", help="Project (tenant) id")],
    user: Annotated[str, typer.Option("--user", help="User id")],
    image: Annotated[
        str | None, typer.Option("--image", help="Image ref (default: the cells' default image)")
    ] = None,
    count: Annotated[
        int, typer.Option("--count", min=1, max=MAX_BOOT_COUNT, help="How many instances")
    ] = 1,
    cell: Annotated[
        str | None, typer.Option("--cell", help="Cell name or uuid (default: the scheduler picks)")
    ] = None,
    availability_zone: Annotated[
        str | None, typer.Option("--az", help="Availability zone (default: any)")
    ] = None,
    key_name: Annotated[str | None, typer.Option("--key-name", help="Key pair name")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="Tag (repeatable)")] = None,
) -> None:
    """Schedule and build instances; prints each one and the scheduler's selections."""
    from cellsight.cells.instances import BootRequest

    optional = {"image_ref": image} if image is not None else {}
    request = BootRequest(
        display_name=name,
        flavor=flavor,
        project_id=project,
        user_id=user,
        **optional,  # type: ignore[arg-type]
        count=count,
        cell=cell,
        availability_zone=availability_zone,
        key_name=key_name,
        tags=list(tag or []),
    )
    result = _run(ctx, lambda ops: ops.boot(request))
    for payload, selections in zip(result.instances, result.selections, strict=True):
        _show(payload)
        alternates = ", ".join(s.service_host for s in selections[1:]) or "none"
        console.print(
            f"  cell {result.cell.name}, alternates: {alternates}", highlight=False, soft_wrap=True
        )


@app.command("show")
def show(ctx: typer.Context, uuid: Uuid) -> None:
    """The instance's snapshot as notifications carry it (JSON)."""
    from cellsight.cells.database import connect
    from cellsight.cells.errors import InstanceNotFound
    from cellsight.cells.reads import get_instance
    from cellsight.cells.rows import action_payload

    with open_registry(ctx) as registry:
        cell = registry.locate(uuid)
        with connect(registry.cell_engine(cell)) as conn:
            row = get_instance(conn, uuid)
        if row is None:
            raise InstanceNotFound(uuid, f"cell {cell.name}")
        console.print_json(json.dumps(action_payload(row, cell.uuid).to_primitive()))


@app.command("rename")
def rename(
    ctx: typer.Context, uuid: Uuid, name: Annotated[str, typer.Argument(help="New display name")]
) -> None:
    """Change the display name."""
    _show(_run(ctx, lambda ops: ops.rename(uuid, name)))


@app.command("meta")
def meta(
    ctx: typer.Context,
    uuid: Uuid,
    items: Annotated[list[str] | None, typer.Argument(help="key=value to set")] = None,
    remove: Annotated[list[str] | None, typer.Option("--remove", help="Key to remove")] = None,
) -> None:
    """Set and remove metadata items."""
    pairs: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"metadata item {item!r} is not key=value")
        pairs[key] = value
    _show(_run(ctx, lambda ops: ops.update_metadata(uuid, pairs, remove or [])))


@app.command("tags")
def tags(
    ctx: typer.Context,
    uuid: Uuid,
    tag: Annotated[list[str] | None, typer.Argument(help="The new tag set")] = None,
) -> None:
    """Replace the instance's tags."""
    _show(_run(ctx, lambda ops: ops.set_tags(uuid, tag or [])))


@app.command("stop")
def stop(ctx: typer.Context, uuid: Uuid) -> None:
    """Power off."""
    _show(_run(ctx, lambda ops: ops.power_off(uuid)))


@app.command("start")
def start(ctx: typer.Context, uuid: Uuid) -> None:
    """Power on."""
    _show(_run(ctx, lambda ops: ops.power_on(uuid)))


@app.command("reboot")
def reboot(
    ctx: typer.Context,
    uuid: Uuid,
    hard: Annotated[
        bool, typer.Option("--hard", help="Power-cycle instead of a clean reboot")
    ] = False,
) -> None:
    """Reboot (soft by default)."""
    _show(_run(ctx, lambda ops: ops.reboot(uuid, hard=hard)))


@app.command("resize")
def resize(
    ctx: typer.Context, uuid: Uuid, flavor: Annotated[str, typer.Argument(help="New flavor name")]
) -> None:
    """Change the flavor (on the same host)."""
    _show(_run(ctx, lambda ops: ops.resize(uuid, flavor)))


@app.command("migrate")
def migrate(
    ctx: typer.Context,
    uuid: Uuid,
    host: Annotated[
        str | None, typer.Option("--host", help="Destination (default: scheduler)")
    ] = None,
) -> None:
    """Live-migrate to another host of the same cell."""
    _show(_run(ctx, lambda ops: ops.live_migrate(uuid, host)))


@app.command("lock")
def lock(
    ctx: typer.Context,
    uuid: Uuid,
    reason: Annotated[str | None, typer.Option("--reason", help="Why (shown to users)")] = None,
) -> None:
    """Lock: only admins may act on the instance until it is unlocked."""
    _show(_run(ctx, lambda ops: ops.lock(uuid, reason)))


@app.command("unlock")
def unlock(ctx: typer.Context, uuid: Uuid) -> None:
    """Unlock."""
    _show(_run(ctx, lambda ops: ops.unlock(uuid)))


@app.command("delete")
def delete(ctx: typer.Context, uuid: Uuid) -> None:
    """Soft delete: the row stays, marked deleted."""
    _show(_run(ctx, lambda ops: ops.delete(uuid)))
