"""``cellsight api``: serve the HTTP API with uvicorn."""

from __future__ import annotations

from typing import Annotated

import typer

from cellsight.cli.context import settings_of

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

    settings = settings_of(ctx)
    app = create_app(settings, freeze_startup=True)  # a process that only serves the API
    uvicorn.run(
        app,
        host=host or settings.api_host,
        port=settings.api_port if port is None else port,
        log_level=settings.log_level.lower(),
    )
