"""``cellsight query instance|node`` and ``cellsight query fields``, ``cellsight nodes refresh``.

The table is printed as ``gnt-instance list`` prints one: a header of the field titles,
columns aligned (numbers to the right) or joined by ``--separator``, units converted
by ``--units`` (``h`` human, ``m`` MiB, ``g`` GiB), values that are not there shown as
``(nodata)`` (status 2: the cell did not answer), ``(unavail)`` (3) or ``(offline)``
(4). Unknown fields are warned about and left out. ``--strict`` exits 1 when a value
was missing (status 1, 2 or 4); ``--json`` prints the API's answer for scripts.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.markup import escape

from cellsight.cli.context import console, err_console, fail, require_data_dir, settings_of
from cellsight.cli.querysource import (
    ADMIN_TOKEN,
    LocalSource,
    RemoteSource,
    Source,
    SourceError,
)

app = typer.Typer(name="query", help="Query v2 for people: tables of instances and nodes.")
nodes_app = typer.Typer(name="nodes", help="Compute nodes: the API's node state cache.")

DEFAULT_FIELDS = {
    "instance": ["name", "status", "host", "flavor_name", "tenant_id"],
    "node": ["host", "cell_uuid", "memory_mb", "memory_mb_used", "vcpus", "vcpus_used", "offline"],
}
STATUS_TEXT = {2: "(nodata)", 3: "(unavail)", 4: "(offline)"}
MISSING = frozenset({1, 2, 4})
Url = Annotated[
    str | None,
    typer.Option("--url", help="A running API (default: the local data directory)"),
]
Token = Annotated[
    str | None,
    typer.Option(
        "--token",
        help="X-Auth-Token to send to --url (default: CELLSIGHT_API_TOKEN, else cli:admin, "
        "an administrator in auth_mode dev)",
        show_default=False,
    ),
]


def _source(ctx: typer.Context, url: str | None, token: str | None) -> Source:
    if token is not None and not token.strip():
        fail("--token: must not be empty")
    if url is not None and not url.strip():  # as an empty --token: not "the default"
        fail("--url: must not be empty (leave it out for the local data directory)")
    if not url:
        if token is not None:
            fail("--token: only with --url (the local data directory needs none)")
        return LocalSource(require_data_dir(ctx, registry=True, engine=True))
    return RemoteSource(url, token or settings_of(ctx).api_token or ADMIN_TOKEN)


def format_unit(mib: float, units: str) -> str:
    """Ganeti's FormatUnit: ``h`` picks M, G or T; ``m`` and ``g`` are fixed."""
    if units == "m":
        return f"{mib:.0f}"
    if units == "g":
        return f"{mib / 1024:.1f}"
    if abs(mib) < 1024:
        return f"{mib:.0f}M"
    if abs(mib) < 1024 * 1024:
        return f"{mib / 1024:.1f}G"
    return f"{mib / 1024 / 1024:.1f}T"


def format_value(definition: dict[str, str], status: int, value: Any, units: str) -> str:
    if status != 0:
        return STATUS_TEXT.get(status, "(unknown)")
    kind = definition["kind"]
    if isinstance(value, bool):
        return "Y" if value else "N"
    if kind == "unit" and isinstance(value, int | float):
        mib = value * 1024 if "gb" in definition["name"] else value
        return format_unit(mib, units)
    if kind == "timestamp" and isinstance(value, int | float):
        try:
            return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S")
        except (ValueError, OverflowError, OSError):
            return str(value)  # past the calendar (another server's): shown as it came
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def render_table(
    definitions: list[dict[str, str]],
    rows: list[list[list[Any]]],
    *,
    units: str = "h",
    separator: str | None = None,
    headers: bool = True,
) -> list[str]:
    table = [[format_value(d, s, v, units) for d, (s, v) in zip(definitions, r, strict=True)]
             for r in rows]  # fmt: skip
    if headers:
        # Fixed units are said once, in the header (a title like MemoryMB over GiB
        # figures misled an operator probe); ``h`` puts a unit after every figure.
        fixed = {"m": " (MiB)", "g": " (GiB)"}.get(units, "")
        table.insert(0, [d["title"] + (fixed if d["kind"] == "unit" else "") for d in definitions])
    if separator is not None:
        return [separator.join(line) for line in table]
    widths = [max((len(line[i]) for line in table), default=0) for i in range(len(definitions))]
    right = [d["kind"] in ("number", "unit") for d in definitions]
    return [
        " ".join(
            (cell.rjust(w) if r else cell.ljust(w))
            for cell, w, r in zip(line, widths, right, strict=True)
        ).rstrip()
        for line in table
    ]


def run_query(
    ctx: typer.Context,
    resource: str,
    fields: str | None,
    filter_text: str | None,
    *,
    as_json: bool,
    separator: str | None,
    no_headers: bool,
    units: str,
    strict: bool,
    url: str | None,
    token: str | None = None,
) -> None:
    names = [f.strip() for f in fields.split(",") if f.strip()] if fields is not None else None
    if names == []:  # '' or ',,,' asked for no field; the defaults are for FIELDS left out
        fail(f"FIELDS names no field ({fields!r}): give comma-separated names or leave it out")
    source = _source(ctx, url, token)
    try:
        answer = source.query(resource, names or DEFAULT_FIELDS[resource], filter_text)
    except SourceError as exc:
        fail(str(exc), code=exc.code)
    if as_json:
        console.print_json(json.dumps(answer.body))
        return
    definitions = answer.body["fields"]
    keep = [i for i, d in enumerate(definitions) if d["kind"] != "unknown"]
    unknown = [d["name"] for d in definitions if d["kind"] == "unknown"]
    if unknown and not keep:  # a table of empty lines, one per item, would say nothing
        fail(f"no known field among {', '.join(unknown)} (`cellsight query fields {resource}`)")
    if unknown:
        err_console.print(f"Unknown field(s): {escape(', '.join(unknown))}", highlight=False)
    rows = [[row[i] for i in keep] for row in answer.body["data"]]
    for line in render_table(
        [definitions[i] for i in keep], rows, units=units, separator=separator,
        headers=not no_headers,
    ):  # fmt: skip
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if answer.skipped_cells:
        err_console.print(f"cells that did not answer: {answer.skipped_cells}", highlight=False)
    missing = bool(unknown) or any(s in MISSING for row in rows for s, _ in row)
    if strict and missing:
        raise typer.Exit(1)


def _command(resource: str) -> Any:
    def command(
        ctx: typer.Context,
        fields: Annotated[str | None, typer.Argument(help="Comma-separated field names")] = None,
        filter_text: Annotated[
            str | None, typer.Option("--filter", help="e.g. 'name =~ m/^web/ and not locked'")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="The API's JSON answer")] = False,
        separator: Annotated[
            str | None,
            typer.Option("--separator", help="Join columns with this (default: aligned)"),
        ] = None,
        no_headers: Annotated[
            bool, typer.Option("--no-headers", help="Leave out the title line")
        ] = False,
        units: Annotated[str, typer.Option("--units", help="h, m or g")] = "h",
        strict: Annotated[bool, typer.Option("--strict", help="Exit 1 if data is missing")] = False,
        url: Url = None,
        token: Token = None,
    ) -> None:
        if units not in ("h", "m", "g"):
            fail(f"--units {units!r}: use h, m or g")
        run_query(
            ctx, resource, fields, filter_text, as_json=as_json, separator=separator,
            no_headers=no_headers, units=units, strict=strict, url=url, token=token,
        )  # fmt: skip

    command.__doc__ = f"List {resource}s as a table (fields: cellsight query fields {resource})."
    return command


app.command("instance")(_command("instance"))
app.command("node")(_command("node"))


@app.command("fields")
def fields(
    ctx: typer.Context,
    resource: Annotated[str, typer.Argument(help="instance or node")],
    url: Url = None,
    token: Token = None,
) -> None:
    """The fields of a resource: name, title, kind and description."""
    source = _source(ctx, url, token)
    try:
        definitions = source.fields(resource)
    except SourceError as exc:
        fail(str(exc), code=exc.code)
    table = [[d["name"], d["title"], d["kind"], d["doc"]] for d in definitions]
    heads = [
        {"name": n, "title": n, "kind": "text"} for n in ("Name", "Title", "Kind", "Description")
    ]
    for line in render_table(heads, [[[0, v] for v in row] for row in table]):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


@nodes_app.command("refresh")
def refresh(ctx: typer.Context, url: Url = None, token: Token = None) -> None:
    """Snapshot every cell's nodes into the node state cache (of the API at --url)."""
    source = _source(ctx, url, token)
    try:
        summary = source.refresh_nodes()
    except SourceError as exc:
        fail(str(exc), code=exc.code)
    skipped = ", ".join(summary["skipped_cells"]) or "none"
    # Without --url the cache filled is this command's own, gone as it exits: a check of
    # the cells, not a refresh of any running API's cache (an operator probe took it so).
    local = "" if url else "; a check only: --url fills a running API's node cache"
    console.print(
        f"{summary['nodes']} nodes from {summary['source']} in {summary['seconds']:.3f} s; "
        f"cells that did not answer: {skipped}{local}",
        highlight=False,
    )
