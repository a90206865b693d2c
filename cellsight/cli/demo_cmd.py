"""``cellsight demo``: the whole system on the embedded defaults, in one process.

First run: seeds cells (SQLite). Every run: backfills the index with a bulk sync, runs
the indexer on the embedded Redis bus and the API, then keeps a gentle live stream of
random cluster operations going so that listings change while the index follows the
cells. Re-running reuses the data (``--fresh`` starts over); one Ctrl-C stops it all.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from cellsight.cli.bounds import MAX_CELLS, MAX_INSTANCES, MAX_SECONDS
from cellsight.cli.context import console, fail, print_table, settings_of
from cellsight.cli.errors import RUNTIME, USAGE
from cellsight.cli.interrupts import terminate_as_interrupt
from cellsight.notifications.errors import plural

if TYPE_CHECKING:
    from cellsight.cells.mappings import CellRegistry
    from cellsight.cells.operations import Operations

ADMIN = {"X-Auth-Token": "demo:admin"}
SHOWCASE = "demo-web"
DATA_MARKERS = ("api.db", "cells", "bus", "index.db")


def _get(port: int, path: str, headers: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.loads(response.read()), dict(response.headers)


def _start_over(data_dir: Path) -> None:
    if not data_dir.exists():
        return
    entries = {p.name for p in data_dir.iterdir()}
    if entries and not entries & set(DATA_MARKERS):
        fail(f"--fresh: {data_dir} does not look like a Cellsight data directory; not deleting it")
    shutil.rmtree(data_dir)
    console.print(f"--fresh: removed {data_dir}", highlight=False)


def demo(
    ctx: typer.Context,
    cells: Annotated[
        int, typer.Option(min=1, max=MAX_CELLS, help="Cells to seed on first run")
    ] = 3,
    instances: Annotated[
        int, typer.Option(min=1, max=MAX_INSTANCES, help="Instances per seeded cell")
    ] = 2000,
    serve: Annotated[
        bool, typer.Option(help="Keep serving with live operations until Ctrl-C (--no-serve: exit)")
    ] = True,
    port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="API port (default: 8774; 0 picks a free one)"),
    ] = None,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Delete the demo data and start over")
    ] = False,
    interval: Annotated[
        float,
        typer.Option(min=0.01, max=MAX_SECONDS, help="Seconds between live operations"),
    ] = 1.0,
) -> None:
    """Seed cells (first run), sync the index, run the indexer, the API and a live
    stream of cluster operations on the embedded defaults. Serves on 127.0.0.1:8774."""
    from cellsight.cells.mappings import CellRegistry
    from cellsight.cli.cells_cmd import seed
    from cellsight.cli.ports import check_api_bind
    from cellsight.cli.progress import progress_for
    from cellsight.clients import build_engine
    from cellsight.indexer.sync import SyncOptions, run_sync

    settings = settings_of(ctx)
    # --no-serve only shows a few requests and exits: on a free port unless --port is
    # given, so it runs beside a service that holds 8774 (CI's smoke test, an API).
    bind = (settings.api_port if serve else 0) if port is None else port
    check_api_bind(ctx, None, port, bind)
    if fresh:
        _start_over(settings.data_dir)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        registry = CellRegistry.from_settings(settings)
        stack.callback(registry.close)
        if not registry.list_cells():
            console.rule("1. seed the cells")
            seed(
                ctx,
                cells=cells,
                instances=instances,
                db_url=None,
                seed_value=0,
                chunk_size=10_000,
                notify=False,
            )
        else:
            console.print(
                f"reusing {plural(len(registry.list_cells()), 'cell')} in {settings.data_dir}"
            )
        engine = build_engine(settings)
        stack.callback(engine.close)
        console.rule("2. bulk sync: backfill the index from the cells")
        for resource in ("instance", "node"):
            with progress_for(console, as_json=False) as progress:
                report = run_sync(
                    engine, registry, SyncOptions(resource=resource), progress=progress
                )
            console.print(
                f"{resource}: {report.as_dict().get('documents', '?')} documents into "
                f"{report.index} in {report.seconds:.2f} s",
                highlight=False,
            )
        _run(ctx, stack, engine, registry, bind, serve, interval)


def _run(
    ctx: typer.Context,
    stack: ExitStack,
    engine: Any,
    registry: CellRegistry,
    bind: int,
    serve: bool,
    interval: float,
) -> None:
    import uvicorn

    from cellsight.api.app import create_app
    from cellsight.cells.operations import Operations
    from cellsight.cli.demo_live import LiveStream
    from cellsight.cli.ports import serve_metrics
    from cellsight.clients import build_bus, build_consumer_config, build_notifier
    from cellsight.indexer.consumer import IndexerConsumer
    from cellsight.indexer.outcomes import totals_line

    settings = settings_of(ctx)
    console.rule("3. indexer on the embedded bus")
    bus = stack.enter_context(build_bus(settings))
    connection = stack.enter_context(bus.connection())
    consumer = IndexerConsumer(
        connection,
        engine,
        build_consumer_config(settings, batch_age=0.1),
        revive_bus=bus.reviver,  # the embedded Redis server, should it die
    )
    worker = threading.Thread(target=consumer.run, name="indexer", daemon=True)
    # On the indexer's bus: one handle on the server in this process, kept current when
    # the indexer brings a dead server back.
    notifier = stack.enter_context(build_notifier(settings, bus=bus))
    worker.start()

    def stop_indexer() -> None:
        consumer.stop.set()
        worker.join(30)

    stack.callback(stop_indexer)
    ops = Operations(
        registry,
        notifier,
        publisher_id="cellsight-demo",
        default_availability_zone=settings.default_availability_zone,
    )
    uuids = _showcase(ops)
    deadline = time.monotonic() + 60
    while not all(_indexed(engine, u) for u in uuids):
        if time.monotonic() > deadline:
            fail("the indexer did not index the demo operations within 60 s", code=RUNTIME)
        time.sleep(0.1)
    console.print(f"indexer: {totals_line(consumer.totals)}", highlight=False)
    metrics_port = settings.metrics_port if settings.metrics_port is not None else _free_port()
    serve_metrics(metrics_port)

    console.rule("4. the API")
    app = create_app(settings, engine=engine, registry=registry)
    server = uvicorn.Server(
        uvicorn.Config(app, host=settings.api_host, port=bind, log_level="warning")
    )
    web = threading.Thread(target=server.run, name="api", daemon=True)
    web.start()

    def stop_api() -> None:
        server.should_exit = True
        web.join(10)

    stack.callback(stop_api)
    while not server.started:
        if not web.is_alive():
            fail(f"--port {bind}: the API could not listen; choose another --port", code=USAGE)
        time.sleep(0.05)
    bound = server.servers[0].sockets[0].getsockname()[1]
    _show(bound)
    if not serve:
        return
    live = LiveStream(ops, registry, interval)
    streamer = threading.Thread(target=live.run, name="live-ops", daemon=True)
    streamer.start()

    def stop_live() -> None:
        live.stop.set()
        streamer.join(30)
        console.print(f"live operations: {dict(live.done)}; refused: {dict(live.refused)}")

    stack.callback(stop_live)
    _banner(settings.api_host, bound, metrics_port, interval)
    # SIGTERM (a service manager, `timeout`) stops it as cleanly as Ctrl-C does.
    try:
        with terminate_as_interrupt():
            while web.is_alive() and worker.is_alive():
                web.join(0.5)
    except KeyboardInterrupt:
        console.print("stopping")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _indexed(engine: Any, uuid: str) -> bool:
    doc = engine.get("instance", uuid)
    return doc is not None and doc.document.get("event_type") != "instance.create.start"


def _showcase(ops: Operations) -> list[str]:
    """Three ``demo-web`` servers (booted once: a re-run finds them in the cells); the
    uuids whose documents the indexer is waited for."""
    from cellsight.cells.instances import BootRequest

    existing = _showcase_in_cells(ops)
    if existing:
        console.print(f"reusing the {SHOWCASE} servers", highlight=False)
        # A deleted one's document may be gone for good: ``index purge`` drops
        # tombstones, and a sync does not bring them back (the demo never ended).
        return [uuid for uuid, deleted in existing if not deleted]
    made = ops.boot(
        BootRequest(
            display_name=SHOWCASE,
            flavor="m1.small",
            project_id="demo",
            user_id="alice",
            count=3,
            tags=["web"],
        )
    )
    uuids = [p.uuid for p in made.instances]
    ops.rename(uuids[0], f"{SHOWCASE}-primary")
    ops.power_off(uuids[1])
    ops.delete(uuids[2])
    return uuids


def _showcase_in_cells(ops: Operations) -> list[tuple[str, bool]]:
    """The showcase servers in the cells, and whether each is deleted."""
    from cellsight.cells.database import connect
    from cellsight.cells.reads import iter_instances

    found = []
    for cell in ops.registry.list_cells():
        with connect(ops.registry.cell_engine(cell)) as conn:
            for row in iter_instances(conn, include_deleted=True):
                if str(row.get("project_id")) == "demo" and str(
                    row.get("display_name") or ""
                ).startswith(SHOWCASE):
                    found.append((str(row["uuid"]), bool(row.get("deleted"))))
    return found


def _banner(host: str, port: int, metrics_port: int, interval: float) -> None:
    base = f"http://{host}:{port}"
    console.print(
        f"\nCellsight API: {base}/v2.1  (Ctrl-C stops everything)\n"
        f"  curl -H 'X-Auth-Token: me:admin' "
        f"'{base}/v2.1/servers/detail?all_tenants=1&limit=5&sort_key=updated_at&sort_dir=desc'\n"
        f"  curl -H 'X-Auth-Token: alice:demo' '{base}/v2.1/servers?name=^demo'\n"
        f"docs: {base}/docs (ReDoc: {base}/redoc)\n"
        f"metrics: http://127.0.0.1:{metrics_port}/metrics (indexer)\n"
        f"a random operation every {interval:g} s keeps the listings changing",
        highlight=False,
        soft_wrap=True,
    )


def _show(port: int) -> None:
    from rich.table import Table

    status, health, _ = _get(port, "/healthz", ADMIN)
    console.print(f"GET /healthz → {status}: {json.dumps(health)}", highlight=False, soft_wrap=True)
    status, body, headers = _get(
        port, "/v2.1/servers/detail?all_tenants=1&limit=5&sort_key=display_name&sort_dir=asc", ADMIN
    )
    table = Table(
        title=f"GET /v2.1/servers/detail?all_tenants=1&limit=5 → {status} "
        f"(path: {headers.get('x-cellsight-path', '?')})"
    )
    columns = ("id", "name", "status", "tenant_id", "OS-EXT-SRV-ATTR:host")
    for column in columns:
        table.add_column(column)
    for server in body["servers"]:
        table.add_row(*(escape(str(server.get(c))) for c in columns))
    print_table(table)
    status, mine, _ = _get(port, "/v2.1/servers?name=^demo", {"X-Auth-Token": "alice:demo"})
    names = sorted(s["name"] for s in mine["servers"])
    console.print(
        f"alice (project demo) sees {len(names)} servers named ^demo: {names}", highlight=False
    )
