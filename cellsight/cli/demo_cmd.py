"""``cellsight demo``: the whole system on the embedded defaults, in one process.

Seeds cells (SQLite), backfills the index with a bulk sync, runs the indexer on the
embedded Redis bus, performs live cluster operations whose notifications flow through
it, then serves the API and shows a few requests answered from the index.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request
from contextlib import ExitStack
from types import FrameType
from typing import Annotated, Any

import typer
from rich.table import Table

from cellsight.cli.context import console, fail, settings_of

ADMIN = {"X-Auth-Token": "demo:admin"}


def _get(port: int, path: str, headers: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.loads(response.read()), dict(response.headers)


def demo(
    ctx: typer.Context,
    cells: Annotated[int, typer.Option(min=1, help="Cells to seed on first run")] = 3,
    instances: Annotated[int, typer.Option(min=1, help="Instances per seeded cell")] = 2000,
    serve: Annotated[bool, typer.Option(help="Keep serving the API until Ctrl-C")] = True,
    port: Annotated[int | None, typer.Option(min=0, max=65535, help="API port")] = None,
) -> None:
    """Seed cells, sync the index, run the indexer and the API on the embedded defaults."""
    import uvicorn

    from api.app import create_app
    from cells.instances import BootRequest
    from cells.mappings import CellRegistry
    from cells.operations import Operations
    from cellsight.cli.cells_cmd import seed
    from cellsight.clients import build_bus, build_consumer_config, build_engine, build_notifier
    from indexer.consumer import IndexerConsumer
    from indexer.sync import SyncOptions, run_sync

    settings = settings_of(ctx)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    registry = CellRegistry.from_settings(settings)
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
    engine = build_engine(settings)
    console.rule("2. bulk sync: backfill the index from the cells")
    for resource in ("instance", "node"):
        report = run_sync(engine, registry, SyncOptions(resource=resource))
        console.print(
            f"{resource}: {report.as_dict().get('documents', '?')} documents into "
            f"{report.index} in {report.seconds:.2f} s",
            highlight=False,
        )
    with ExitStack() as stack:
        console.rule("3. indexer on the embedded bus, live operations")
        bus = stack.enter_context(build_bus(settings))
        connection = stack.enter_context(bus.connection())
        consumer = IndexerConsumer(
            connection,
            engine,
            build_consumer_config(settings, batch_age=0.1),
        )
        worker = threading.Thread(target=consumer.run, name="indexer", daemon=True)
        notifier = stack.enter_context(build_notifier(settings))
        worker.start()
        ops = Operations(registry, notifier, publisher_id="cellsight-demo")
        made = ops.boot(
            BootRequest(
                display_name="demo-web",
                flavor="m1.small",
                project_id="demo",
                user_id="alice",
                count=3,
                tags=["web"],
            )
        )
        uuids = [p.uuid for p in made.instances]
        ops.rename(uuids[0], "demo-web-primary")
        ops.power_off(uuids[1])
        ops.delete(uuids[2])
        deadline = time.monotonic() + 60
        while consumer.acked < 1 or not all(
            (doc := engine.get("instance", u)) is not None
            and doc.document.get("event_type") != "instance.create.start"
            for u in uuids
        ):
            if time.monotonic() > deadline:
                fail("the indexer did not index the demo operations within 60 s", code=1)
            time.sleep(0.1)
        console.print(f"indexer: {consumer.totals}", highlight=False)

        console.rule("4. the API")
        app = create_app(settings, engine=engine, registry=registry)
        config = uvicorn.Config(
            app,
            host=settings.api_host,
            port=settings.api_port if port is None else port,
            log_level="warning",
        )
        server = uvicorn.Server(config)
        web = threading.Thread(target=server.run, name="api", daemon=True)
        web.start()
        while not server.started:
            time.sleep(0.05)
        bound = server.servers[0].sockets[0].getsockname()[1]
        _show(bound)
        if serve:
            # SIGTERM (a service manager, `timeout`) stops it as cleanly as Ctrl-C does.
            signal.signal(signal.SIGTERM, _interrupt)
            console.print(
                f"\nserving on http://{settings.api_host}:{bound} (Ctrl-C stops):\n"
                f"  curl -H 'X-Auth-Token: me:admin' "
                f"'http://{settings.api_host}:{bound}/v2.1/servers/detail?all_tenants=1&limit=5'\n"
                f"  curl -H 'X-Auth-Token: alice:demo' "
                f"'http://{settings.api_host}:{bound}/v2.1/servers?name=^demo'",
                highlight=False,
                soft_wrap=True,
            )
            try:
                while web.is_alive():
                    time.sleep(0.5)
            except KeyboardInterrupt:
                console.print("stopping")
        server.should_exit = True
        web.join(10)
        consumer.stop.set()
        worker.join(30)
    engine.close()
    registry.close()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _show(port: int) -> None:
    status, health, _ = _get(port, "/healthz", ADMIN)
    console.print(f"GET /healthz → {status}: {json.dumps(health)}", highlight=False, soft_wrap=True)
    status, body, headers = _get(
        port, "/v2.1/servers/detail?all_tenants=1&limit=5&sort_key=display_name&sort_dir=asc", ADMIN
    )
    table = Table(
        title=f"GET /v2.1/servers/detail?all_tenants=1&limit=5 → {status} "
        f"(path: {headers.get('x-cellsight-path', '?')})"
    )
    for column in ("id", "name", "status", "tenant_id", "OS-EXT-SRV-ATTR:host"):
        table.add_column(column)
    for server in body["servers"]:
        table.add_row(
            *(
                str(server.get(c))
                for c in ("id", "name", "status", "tenant_id", "OS-EXT-SRV-ATTR:host")
            )
        )
    console.print(table)
    status, mine, _ = _get(port, "/v2.1/servers?name=^demo", {"X-Auth-Token": "alice:demo"})
    names = sorted(s["name"] for s in mine["servers"])
    console.print(
        f"alice (project demo) sees {len(names)} servers named ^demo: {names}", highlight=False
    )
