"""``cellsight ops reserve|modify|commit|cancel``: reservations (forthcoming instances).

``cellsight ops rename UUID NAME`` renames a reservation as it renames an instance.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from cellsight.cli.context import canonical_uuid, console, fail
from cellsight.cli.ops_cmd import _run, _show

MAX_LENGTH = 255  # Nova's String(255) for names and ids, as the API's bodies


def _bounded(value: str | None) -> str | None:
    """A usage error (exit 2), not a failure of the operation, as the API's 400."""
    from cellsight.cells.text_rules import unprintable  # here: start-up imports no sqlalchemy

    if value is None:
        return None
    if len(value) > MAX_LENGTH:
        raise typer.BadParameter(f"at most {MAX_LENGTH} characters")
    if (char := unprintable(value)) is not None:
        raise typer.BadParameter(f"holds U+{ord(char):04X} (not a printable character)")
    return value


Uuid = Annotated[str, typer.Argument(help="Reservation uuid", callback=canonical_uuid)]
Name = Annotated[
    str | None, typer.Option(help="Display name (default: none yet)", callback=_bounded)
]
Project = Annotated[
    str | None,
    typer.Option(help="Project (tenant) id (default: none yet)", callback=_bounded),
]
User = Annotated[str | None, typer.Option(help="User id (default: none yet)", callback=_bounded)]
Flavor = Annotated[
    str | None,
    typer.Option(help="Flavor name; its resources are claimed (default: none)", callback=_bounded),
]
Host = Annotated[
    str | None,
    typer.Option(help="Compute host to hold it on (default: chosen)", callback=_bounded),
]


def reserve(
    ctx: typer.Context,
    uuid: Annotated[
        str | None, typer.Option("--uuid", help="Default: a new one", callback=canonical_uuid)
    ] = None,
    name: Name = None,
    project: Project = None,
    user: User = None,
    flavor: Flavor = None,
    cell: Annotated[
        str | None, typer.Option(help="Cell name or uuid (default: chosen)", callback=_bounded)
    ] = None,
    host: Host = None,
) -> None:
    """Reserve capacity for a forthcoming instance; only its uuid is mandatory."""
    from cellsight.cells.reservations import Reservations

    result = _run(
        ctx,
        lambda ops: Reservations(ops).reserve(
            uuid, name=name, project_id=project, user_id=user, flavor=flavor, cell=cell, host=host
        ),
    )
    assert result.payload is not None
    _show(result.payload)
    picks = ", ".join(s.service_host for s in result.selections) or "none"
    console.print(f"  cell {result.cell.name}, selections: {picks}", highlight=False)


def modify(
    ctx: typer.Context,
    uuid: Uuid,
    name: Name = None,
    project: Project = None,
    user: User = None,
    flavor: Flavor = None,
    host: Host = None,
) -> None:
    """Change the given attributes of a reservation (a new flavor or host moves its claim)."""
    from cellsight.cells.reservations import Reservations

    given: dict[str, Any] = {
        k: v
        for k, v in {
            "name": name, "project_id": project, "user_id": user, "flavor": flavor, "host": host,
        }.items()
        if v is not None
    }  # fmt: skip
    if not given:
        raise typer.BadParameter("give at least one of --name --project --user --flavor --host")
    _show(_run(ctx, lambda ops: Reservations(ops).modify(uuid, **given)))


# What a reservation lacks, as the options of ``ops modify`` that set it.
_OPTIONS = {"display_name": "--name", "project_id": "--project", "user_id": "--user",
            "flavor": "--flavor", "host": "--host"}  # fmt: skip


def commit(ctx: typer.Context, uuid: Uuid) -> None:
    """Build the reserved instance (name, project, user, flavor and host must be set)."""
    from cellsight.cells.reservations import ReservationIncomplete, Reservations

    try:
        _show(_run(ctx, lambda ops: Reservations(ops).commit(uuid)))
    except ReservationIncomplete as exc:
        options = [_OPTIONS.get(f, f) for f in exc.missing]
        how = f"`cellsight ops modify {uuid} {' '.join(o + ' …' for o in options)}` first"
        fail(f"reservation {uuid} cannot be committed without {' '.join(options)} ({how})", code=1)


def cancel(ctx: typer.Context, uuid: Uuid) -> None:
    """Cancel a reservation and give its resources back."""
    from cellsight.cells.reservations import Reservations

    _show(_run(ctx, lambda ops: Reservations(ops).cancel(uuid)))


def register(app: typer.Typer) -> None:
    for fn in (reserve, modify, commit, cancel):
        app.command(fn.__name__)(fn)
