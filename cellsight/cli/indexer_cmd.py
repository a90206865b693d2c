"""``cellsight indexer``, ``cellsight dlq …`` and ``cellsight index get|purge``."""

from __future__ import annotations

import json
import re
import signal
import threading
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Annotated

import typer

from cellsight.cli.context import console, fail, settings_of

dlq_app = typer.Typer(
    help="Inspect and re-drive dead-lettered notifications.", no_args_is_help=True
)
index_app = typer.Typer(help="Operate the search indexes.", no_args_is_help=True)

_DURATION = re.compile(r"^(\d+)([smhd])$")


def parse_duration(value: str) -> timedelta:
    match = _DURATION.match(value.strip())
    if not match:
        raise typer.BadParameter(f"{value!r} is not a duration like 30d, 12h, 15m or 90s")
    units = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
    return timedelta(**{units[match.group(2)]: int(match.group(1))})


def run_indexer(ctx: typer.Context) -> None:
    """Consume the notification stream into the search indexes until SIGTERM/SIGINT."""
    from cellsight.clients import (
        build_bus,
        build_cell_resolver,
        build_consumer_config,
        build_engine,
    )
    from indexer import metrics
    from indexer.consumer import IndexerConsumer

    settings = settings_of(ctx)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        console.print(f"signal {signum}: flushing and stopping")
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if settings.metrics_port is not None:
        metrics.serve(settings.metrics_port)
    engine = build_engine(settings)
    for resource in ("instance", "node"):
        engine.ensure_ready(resource)
    if settings.verify_interval:
        from cells.mappings import CellRegistry
        from indexer.antientropy import start_periodic_verify

        registry = CellRegistry.from_settings(settings)
        start_periodic_verify(engine, registry, settings.verify_interval, stop)
    config = build_consumer_config(settings)
    with build_bus(settings) as bus, bus.connection() as connection:
        consumer = IndexerConsumer(
            connection, engine, config, stop=stop, cell_resolver=build_cell_resolver(settings)
        )
        console.print(
            f"indexer: {engine.distribution} engine, queue {config.queue} on {bus.display_url}"
        )
        consumer.run()
        console.print(f"indexer stopped: {consumer.totals}")
    engine.close()


@dlq_app.command("list")
def dlq_list(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, help="At most this many")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line")] = False,
) -> None:
    """Show dead-lettered messages and why (they stay in the queue)."""
    from cellsight.clients import build_bus
    from indexer.dlq import peek

    settings = settings_of(ctx)
    with build_bus(settings) as bus, bus.connection() as connection:
        letters = list(
            peek(connection, settings.dead_letter_exchange, settings.dead_letter_queue, limit)
        )
    for letter in letters:
        if as_json:
            print(
                json.dumps(
                    {
                        "reason_code": letter.reason_code,
                        "reason": letter.reason,
                        "event_type": letter.event_type,
                        "routing_key": letter.routing_key,
                        "dead_lettered_at": letter.dead_lettered_at,
                        "body": letter.body.decode("utf-8", "replace"),
                    }
                )
            )
        else:
            console.print(
                f"[bold]{letter.reason_code}[/] {letter.event_type or '-'} "
                f"{letter.dead_lettered_at}: {letter.reason}",
                highlight=False,
            )
    if not as_json:
        console.print(f"{len(letters)} dead letter(s) shown")


@dlq_app.command("replay")
def dlq_replay(
    ctx: typer.Context,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many")] = None,
    reason: Annotated[str | None, typer.Option(help="Only letters with this reason code")] = None,
) -> None:
    """Republish dead letters to the notifications exchange (after a fix)."""
    from cellsight.clients import build_bus
    from indexer.dlq import replay

    settings = settings_of(ctx)
    with build_bus(settings) as bus, bus.connection() as connection:
        done, skipped = replay(
            connection,
            exchange_name=settings.exchange,
            dlx_name=settings.dead_letter_exchange,
            dlq_name=settings.dead_letter_queue,
            limit=limit,
            reason_code=reason,
        )
    console.print(f"replayed {done}, left {skipped} with another reason")


@index_app.command("get")
def index_get(
    ctx: typer.Context,
    uuid: Annotated[str, typer.Argument(help="Instance (or node) uuid")],
    resource: Annotated[str, typer.Option("--type", help="instance or node")] = "instance",
) -> None:
    """Print the stored document and its version."""
    from cellsight.clients import build_engine

    if resource not in ("instance", "node"):
        fail(f"--type {resource!r}: must be instance or node")
    engine = build_engine(settings_of(ctx))
    try:
        stored = engine.get(resource, uuid)
    finally:
        engine.close()
    if stored is None:
        fail(f"no {resource} document with id {uuid}", code=1)
    print(
        json.dumps(
            {"id": stored.id, "version": stored.version, "document": stored.document},
            indent=2,
            sort_keys=True,
        )
    )


@index_app.command("purge")
def index_purge(
    ctx: typer.Context,
    older_than: Annotated[
        str, typer.Option("--older-than", help="Tombstone age, e.g. 30d")
    ] = "30d",
) -> None:
    """Remove tombstones of instances deleted longer ago than --older-than, and record a
    floor so that a very late stale event cannot recreate them."""
    from cellsight.clients import build_engine
    from indexer.purge import purge_tombstones

    try:
        age = parse_duration(older_than)
    except typer.BadParameter as exc:
        fail(f"--older-than: {exc}")
    engine = build_engine(settings_of(ctx))
    try:
        removed = purge_tombstones(engine, datetime.now(UTC) - age)
    finally:
        engine.close()
    console.print(
        f"purged {removed} tombstone(s) deleted before {datetime.now(UTC) - age:%Y-%m-%d %H:%M}Z"
    )


# sync, status and verify live in their own module; importing it registers them here.
from cellsight.cli import index_sync_cmd  # noqa: E402, F401
