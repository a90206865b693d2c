"""``cellsight indexer``, ``cellsight dlq …`` and ``cellsight index get|purge``
(registered in ``cellsight.cli.groups``)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer
from rich.markup import escape

from cellsight.cli.bounds import MAX_LETTERS, MAX_WORKERS
from cellsight.cli.context import (
    State,
    canonical_uuid,
    console,
    fail,
    open_registry,
    require_data_dir,
    settings_of,
)
from cellsight.cli.errors import INTERRUPTED

dlq_app = typer.Typer(
    help="Inspect and re-drive dead-lettered notifications.", no_args_is_help=True
)

# Any number of digits: past 12 a value is longer than MAX_DURATION, and is told so.
_DURATION = re.compile(r"^([0-9]+)([smhd])$")
# A bound far past any retention (and within what a date can hold, where now minus the
# age lands): an age of thousands of years was an OverflowError, not a usage error.
MAX_DURATION = timedelta(days=365 * 1000)


def parse_duration(value: str) -> timedelta:
    match = _DURATION.match(value.strip())
    if not match:
        raise typer.BadParameter(f"{value!r} is not a duration like 30d, 12h, 15m or 90s")
    units = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
    digits = match.group(1).lstrip("0") or "0"
    if len(digits) > 12:  # int() of thousands of digits is refused (or slow): too long anyway
        raise typer.BadParameter(f"{value[:40]!r}… is longer than {MAX_DURATION.days} days")
    seconds = int(digits) * timedelta(**{units[match.group(2)]: 1}).total_seconds()
    if seconds > MAX_DURATION.total_seconds():
        raise typer.BadParameter(f"{value!r} is longer than {MAX_DURATION.days} days")
    return timedelta(seconds=seconds)


def run_indexer(
    ctx: typer.Context,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            max=MAX_WORKERS,
            help="Consumer processes on the queue (writes are versioned, so any order is safe)",
        ),
    ] = 1,
) -> None:
    """Consume the notification stream into the search indexes until SIGTERM/SIGINT."""
    from cellsight.cli.indexer_workers import consume, supervise

    settings = settings_of(ctx)
    if workers == 1:
        consume(settings)
        return
    state = ctx.find_root().obj
    raise typer.Exit(supervise(settings, workers, isinstance(state, State) and state.debug))


@dlq_app.command("list")
def dlq_list(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, max=MAX_LETTERS, help="At most this many")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line")] = False,
) -> None:
    """Show dead-lettered messages and why (they stay in the queue)."""
    from cellsight.clients import bus_connection
    from cellsight.indexer.dlq import peek

    settings = require_data_dir(ctx, bus=True)
    with bus_connection(settings) as connection:
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
                        "message_id": letter.message_id,
                        "body": letter.body.decode("utf-8", "replace"),
                    }
                )
            )
        else:
            # What a letter says is a foreign producer's text: printed, not read as markup.
            console.print(
                f"[bold]{escape(letter.reason_code)}[/] {escape(letter.event_type or '-')} "
                f"{escape(letter.dead_lettered_at)}: {escape(letter.reason)}",
                highlight=False,
            )
    if not as_json:
        console.print(f"{len(letters)} dead letter(s) shown")


@dlq_app.command("replay")
def dlq_replay(
    ctx: typer.Context,
    limit: Annotated[
        int | None, typer.Option(min=1, max=MAX_LETTERS, help="At most this many")
    ] = None,
    reason: Annotated[str | None, typer.Option(help="Only letters with this reason code")] = None,
) -> None:
    """Republish dead letters to the notifications exchange (after a fix)."""
    from cellsight.cli.interrupts import terminate_as_interrupt
    from cellsight.clients import bus_connection
    from cellsight.indexer.dlq import REASON_CODES, ReplayInterrupted, ReplayRefused, replay

    if reason is not None and reason not in REASON_CODES:
        # A typo would replay nothing and say so as if all were well.
        fail(f"--reason {reason!r}: not a reason code (known: {', '.join(REASON_CODES)})")
    settings = require_data_dir(ctx, bus=True)
    with bus_connection(settings) as connection, terminate_as_interrupt():
        try:
            done = replay(
                connection,
                exchange_name=settings.exchange,
                dlx_name=settings.dead_letter_exchange,
                dlq_name=settings.dead_letter_queue,
                limit=limit,
                reason_code=reason,
            )
        except ReplayRefused as exc:
            fail(f"{exc} ({exc.replayed} replayed before it)", code=1)
        except ReplayInterrupted as exc:
            fail(f"{exc} in {settings.dead_letter_queue!r}", code=INTERRUPTED)
    # Left: the letters read for another reason, and those past --limit (an operator
    # probe: "left 0" was printed with more letters behind the limit).
    why = [f"{done.other_reason} with another reason"] if done.other_reason else []
    why += [f"{done.unread} past --limit"] if done.unread else []
    left = done.other_reason + done.unread
    console.print(
        f"replayed {done.replayed}, left {left}" + (f" ({', '.join(why)})" if why else ""),
        highlight=False,
    )


def index_get(
    ctx: typer.Context,
    uuid: Annotated[str, typer.Argument(help="Instance (or node) uuid", callback=canonical_uuid)],
    resource: Annotated[str, typer.Option("--type", help="instance or node")] = "instance",
) -> None:
    """Print the stored document and its version."""
    from cellsight.clients import build_engine

    if resource not in ("instance", "node"):
        fail(f"--type {resource!r}: must be instance or node")
    engine = build_engine(require_data_dir(ctx, engine=True))
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


def index_purge(
    ctx: typer.Context,
    older_than: Annotated[
        str, typer.Option("--older-than", help="Tombstone age, e.g. 30d")
    ] = "30d",
) -> None:
    """Remove tombstones of instances deleted longer ago than --older-than, and record a
    floor so that a very late stale event cannot recreate them. Holds the lock a sync or
    verify of instances holds (exit 3 while one runs)."""
    from cellsight.cli.errors import LOCKED, RUNTIME
    from cellsight.clients import build_engine
    from cellsight.indexer.lock import LockHeld, LockLost
    from cellsight.indexer.purge import purge_tombstones

    try:
        age = parse_duration(older_than)
    except typer.BadParameter as exc:
        fail(f"--older-than: {exc}")
    from cellsight.cli.interrupts import terminate_as_interrupt

    engine = build_engine(require_data_dir(ctx, registry=True, engine=True), patient=True)
    try:
        # SIGTERM as Ctrl-C: the lock released, exit 130 (an interrupt probe: 143).
        with terminate_as_interrupt(), open_registry(ctx) as registry:
            removed = purge_tombstones(engine, datetime.now(UTC) - age, registry=registry)
    except LockHeld as exc:
        fail(str(exc), code=LOCKED)
    except LockLost as exc:
        fail(str(exc), code=RUNTIME)
    finally:
        engine.close()
    console.print(
        f"purged {removed} tombstone(s) deleted before {datetime.now(UTC) - age:%Y-%m-%d %H:%M}Z"
    )
