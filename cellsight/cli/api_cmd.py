"""``cellsight api``: serve the HTTP API with uvicorn."""

from __future__ import annotations

from typing import Annotated

import typer

from cellsight.cli.context import fail, settings_of

# Literal so that --help needs no settings import; a test checks them against Settings.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8774


def serve(
    ctx: typer.Context,
    host: Annotated[
        str | None,
        typer.Option(
            "--host",
            help=f"Address to bind (default: {DEFAULT_HOST}, or CELLSIGHT_API_HOST)",
            show_default=False,
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            min=0,
            max=65535,
            help=f"Port to bind (default: {DEFAULT_PORT}, or CELLSIGHT_API_PORT)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve the Nova-compatible server list, query v2, /healthz and the docs at /docs
    (OpenAPI at /openapi.json)."""
    import uvicorn

    from cellsight.api.app import create_app
    from cellsight.cli.errors import RUNTIME
    from cellsight.cli.ports import check_api_bind

    settings = settings_of(ctx)
    bind_port = settings.api_port if port is None else port
    bind_host = check_api_bind(ctx, host, port, bind_port)
    app = create_app(settings, freeze_startup=True)  # a process that only serves the API
    try:
        uvicorn.run(app, host=bind_host, port=bind_port, log_level=settings.log_level.lower())
    except SystemExit as exc:
        # uvicorn's startup failure (3, this CLI's lock-held code): the port was taken
        # between the check and the bind, or the app's startup failed; its log says why.
        if exc.code in (None, 0):
            raise
        fail(
            f"the API did not start on {bind_host}:{bind_port} (uvicorn's log above says why)",
            code=RUNTIME,
        )
