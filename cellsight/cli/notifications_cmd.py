"""``cellsight notifications``: the wire contract from the command line."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cellsight.cli.context import fail, settings_of

if TYPE_CHECKING:
    from cellsight.notifications.envelope import Notification

app = typer.Typer(
    name="notifications",
    help="Export the payload JSON Schemas, validate and publish notification files.",
    no_args_is_help=True,
)

Files = Annotated[
    list[Path],
    typer.Argument(
        help="Notification files, bare or oslo.messaging-wrapped JSON", show_default=False
    ),
]


class UnexpectedDecodeError(Exception):
    """Decoding raised something the contract has no name for (a bug): reported like
    the indexer's ``internal`` dead letters, as one line."""


def _read(path: Path) -> Notification:
    """Decode one file; raises ``NotificationError``, ``OSError`` or
    ``UnexpectedDecodeError``."""
    from cellsight.notifications.envelope import decode
    from cellsight.notifications.errors import NotificationError, TooLarge
    from cellsight.notifications.limits import MAX_BODY_BYTES

    # One byte past the limit tells a body too large: /dev/zero, or a disk image given
    # by mistake, was read whole (a MemoryError) before decode refused it.
    with path.open("rb") as file:
        body = file.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise TooLarge(f"larger than the limit of {MAX_BODY_BYTES} bytes; not read further")
    try:
        return decode(body)
    except NotificationError:
        raise
    except Exception as exc:
        raise UnexpectedDecodeError(f"internal: {type(exc).__name__}: {exc}") from exc


def _dead_lettered(notification: Notification) -> str | None:
    """Why the indexer's planning would refuse what decodes (a probe: a Selection under
    ``compute_node.update`` validated "ok" and was dead-lettered), or None."""
    from cellsight.indexer.outcomes import Outcome, Verdict
    from cellsight.indexer.planning import EventInfo, map_payload
    from cellsight.notifications.errors import NotificationError

    info = EventInfo(notification.event_type, notification.timestamp)
    try:
        result = map_payload(0, notification.payload, notification.event, info)
    except NotificationError as exc:
        return f"{type(exc).__name__}: {exc.message}"
    if isinstance(result, Outcome) and result.verdict is Verdict.DEAD:
        return result.reason or result.reason_code or "refused"
    return None


def _describe_error(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return f"cannot read: {exc.strerror or exc}"
    # A reason can quote a huge or binary value: keep the line short and printable.
    from cellsight.notifications.errors import clip

    return clip(" ".join(f"{type(exc).__name__}: {exc}".split()), 300)


@app.command()
def schema(
    directory: Annotated[
        # Text: Click's Path turns "" into "." (the working directory) before we see it.
        str,
        typer.Option("--out", metavar="PATH", help="Directory to write the schema files into"),
    ] = "schemas",
) -> None:
    """Write one JSON Schema per payload class and version (e.g. InstanceActionPayload-1.9.json)."""
    from cellsight.notifications.schema import write_schemas

    if not directory.strip():
        raise typer.BadParameter(
            "must not be empty (it would be the working directory)", param_hint="'--out'"
        )
    out = Path(directory)

    try:
        written = write_schemas(out)
    except OSError as exc:
        fail(f"--out {out}: {exc.strerror or exc}")
    for path in written:
        typer.echo(str(path))
    typer.echo(f"wrote {len(written)} schema files to {out}")


@app.command()
def validate(files: Files) -> None:
    """Decode each file; print its event type, payload class and version, or the error."""
    from cellsight.notifications.errors import NotificationError

    failed = 0
    for path in files:
        try:
            notification = _read(path)
        except (NotificationError, OSError, UnexpectedDecodeError) as exc:
            failed += 1
            typer.echo(f"FAIL {path}: {_describe_error(exc)}", err=True)
            continue
        why = _dead_lettered(notification)
        if why is not None:
            failed += 1
            typer.echo(f"FAIL {path}: the indexer would dead-letter it: {why}", err=True)
            continue
        payload = notification.payload
        typer.echo(
            f"ok   {path}: {notification.event_type} {payload.obj_name} {payload.obj_version}"
        )
    if failed:
        fail(f"{failed} of {len(files)} files failed validation", code=1)


@app.command()
def publish(
    ctx: typer.Context,
    files: Files,
    declare_indexer_queue: Annotated[
        bool,
        typer.Option(
            help="Declare the indexer queue first, so messages wait for an indexer not yet started"
        ),
    ] = True,
) -> None:
    """Publish the files onto the configured bus (all are validated before any is sent)."""
    from cellsight.clients import build_notifier
    from cellsight.notifications.errors import NotificationError

    notifications = []
    for path in files:
        try:
            notifications.append(_read(path))
        except (NotificationError, OSError, UnexpectedDecodeError) as exc:
            fail(f"{path}: {_describe_error(exc)} (nothing published)")
    settings = settings_of(ctx)
    # a bus that is down or refuses is reported by the CLI boundary (exit 1)
    from cellsight.cli.interrupts import terminate_as_interrupt

    with (
        terminate_as_interrupt(),  # SIGTERM as Ctrl-C: exit 130, as every one-shot command
        build_notifier(settings, declare_indexer_queue=declare_indexer_queue) as notifier,
    ):
        notifier.publish_many(notifications)
        target = notifier.target
    typer.echo(f"published {len(notifications)} notifications to {target}")
