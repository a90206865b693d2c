"""``cellsight outbox relay|status``: publish what producers committed but did not publish."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from typing import TYPE_CHECKING, Annotated

import typer

from cellsight.cli.bounds import MAX_SECONDS
from cellsight.cli.context import console, fail, open_registry, require_data_dir, settings_of
from cellsight.signal_events import EventOnSignal

if TYPE_CHECKING:  # the bus and the notifier import kombu: only the command that runs needs them
    from cellsight.notifications.bus import Bus
    from cellsight.notifications.notifier import Notifier
    from cellsight.settings import Settings

log = logging.getLogger(__name__)

app = typer.Typer(
    name="outbox",
    help="The cells' transactional outboxes: notifications committed with their change.",
    no_args_is_help=True,
)


def relay_beside_indexer(
    settings: Settings, bus: Bus, stop: threading.Event
) -> tuple[Notifier, threading.Thread] | None:
    """Start the periodic relay (``outbox_relay_interval``) on ``bus``; after ``stop``
    the caller joins the returned thread (it waits for the passes under way) and closes
    the notifier. None when the interval is off."""
    if not settings.outbox_relay_interval:
        return None
    from cellsight.cells.mappings import CellRegistry
    from cellsight.cells.outbox import Outbox
    from cellsight.cells.relay_loop import start_periodic_relay
    from cellsight.clients import build_notifier

    notifier = build_notifier(settings, bus=bus)
    relay = Outbox(notifier, lease_seconds=settings.outbox_lease)
    thread = start_periodic_relay(
        CellRegistry.from_settings(settings),
        relay,
        settings.outbox_relay_interval,
        stop,
        settle=settings.publish_timeout,
    )
    return notifier, thread


@app.command("relay")
def relay(
    ctx: typer.Context,
    cell: Annotated[
        list[str] | None, typer.Option("--cell", help="Only this cell (name or uuid); repeatable")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per cell")] = False,
    wait: Annotated[
        bool,
        typer.Option(
            help="Retry a cell whose lease another relay holds until that lease expires "
            "(a producer killed mid-publish leaves one behind)"
        ),
    ] = True,
    every: Annotated[
        float | None,
        typer.Option(
            min=0.1,
            max=MAX_SECONDS,
            help="Keep running: relay every this many seconds until SIGTERM/SIGINT "
            "(a service beside producers the indexer's own relay does not cover)",
        ),
    ] = None,
) -> None:
    """Publish every cell's waiting notifications in order, with publisher confirms.

    Exits 1 when a cell could not be relayed completely (its rows stay for next time),
    or, with nothing waiting, when the bus cannot be reached or refuses the login.
    With ``--every`` it keeps relaying (a failed pass is logged and retried; at the start
    a bus that refuses the login exits 1, one not reachable yet is logged) and exits 0 on
    SIGTERM/SIGINT.
    """
    from cellsight.cells.outbox import Outbox
    from cellsight.cells.relay_loop import relay_cells
    from cellsight.cli.interrupts import terminate_as_interrupt
    from cellsight.clients import build_notifier
    from cellsight.notifications.errors import PublishError

    settings = settings_of(ctx)
    if every is not None:
        _relay_forever(ctx, settings, every)
        return
    require_data_dir(ctx, registry=True, bus=True)  # see ``operations``
    deadline = time.monotonic() + (settings.outbox_lease + 1.0 if wait else 0.0)
    with (
        terminate_as_interrupt(),  # SIGTERM as Ctrl-C: the leases given back (exit 130)
        open_registry(ctx) as registry,
        build_notifier(settings) as notifier,
    ):
        relay = Outbox(notifier, lease_seconds=settings.outbox_lease)
        reports = relay_cells(registry, relay, cell)
        while busy := [name for name, r in reports.items() if r.busy]:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)
            reports.update(relay_cells(registry, relay, busy))
        unchecked: PublishError | None = None
        if not any(r.published or r.error for r in reports.values()):
            # Nothing was waiting, so nothing tried the bus: a wrong bus_url would pass.
            try:
                notifier.check()
            except PublishError as exc:
                unchecked = exc  # raised once each cell's line is out
    failed = []
    for name, report in reports.items():
        if as_json:
            print(json.dumps({"cell": name, **report.as_dict()}))
        else:
            if report.busy:
                state = "busy (another relay holds it)"
            elif report.left is None:  # the cell could not be reached to count them
                state = "left unknown"
            else:
                state = f"{report.left} left"
            console.print(
                f"{name}: published {report.published}, {state}"
                + (f": {report.error}" if report.error else ""),
                highlight=False,
                soft_wrap=True,
            )
        if report.error:
            failed.append(name)
    if unchecked is not None:
        raise unchecked
    if failed:
        fail(f"outbox relay incomplete for {', '.join(failed)}", code=1)


def _relay_forever(ctx: typer.Context, settings: Settings, every: float) -> None:
    from cellsight.cells.outbox import Outbox
    from cellsight.cells.relay_loop import start_periodic_relay
    from cellsight.clients import build_notifier
    from cellsight.notifications.confirm import Refused
    from cellsight.notifications.errors import PublishError

    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    EventOnSignal(stop, previous)  # never Event.set in a handler (``signal_events``)
    try:
        with open_registry(ctx, make=True) as registry, build_notifier(settings) as notifier:
            # A refusal (password, vhost, permissions) ends it at the start: a service
            # manager's restart loop tells the operator, where the periodic passes would
            # only log it when a row first waits. A bus not up yet is waited for.
            try:
                notifier.check()
            except Refused:
                raise
            except PublishError as exc:
                log.warning("outbox relay: the bus cannot be reached yet: %s", exc)
            relay = Outbox(notifier, lease_seconds=settings.outbox_lease)
            console.print(f"relaying every {every:g} s until SIGTERM/SIGINT", highlight=False)
            worker = start_periodic_relay(
                registry, relay, every, stop, settle=settings.publish_timeout
            )
            stop.wait()
            worker.join(timeout=2 * settings.publish_timeout + every)
    finally:
        for sig, handler in previous.items():
            # Once stopping, a second signal has nothing more to say: put back, the
            # default action ended a clean stop with 143 (a probe, 3 runs in 3).
            signal.signal(sig, signal.SIG_IGN if stop.is_set() else handler)
    console.print("outbox relay stopped", highlight=False)


@app.command("status")
def status(ctx: typer.Context) -> None:
    """How many notifications wait in each cell's outbox."""
    from cellsight.cells.database import connect
    from cellsight.cells.errors import CellsError
    from cellsight.cells.outbox import ensure_tables, pending

    with open_registry(ctx) as registry:
        for mapping in registry.list_cells():
            try:
                engine = registry.cell_engine(mapping)
                ensure_tables(engine)
                with connect(engine) as conn:
                    waiting = str(pending(conn))
            except CellsError as exc:
                waiting = f"unavailable: {exc}"
            console.print(f"{mapping.name}: {waiting}", highlight=False, soft_wrap=True)
