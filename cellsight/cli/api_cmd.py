"""``cellsight api``: serve the HTTP API with uvicorn."""

from __future__ import annotations

from typing import Annotated

import typer

from cellsight.cli.context import fail, settings_of
from cellsight.settings import ConfigError


def serve(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option("--host", help="Default: api_host")] = None,
    port: Annotated[
        int | None, typer.Option("--port", min=0, max=65535, help="Default: api_port")
    ] = None,
) -> None:
    """Serve the Nova-compatible server list, query v2 and /healthz (OpenAPI at /openapi.json)."""
    import uvicorn

    from api.app import create_app
    from cells.errors import CellsError
    from indexer.engines.base import EngineError

    settings = settings_of(ctx)
    try:
        app = create_app(settings)
    except (ConfigError, CellsError, EngineError) as exc:
        fail(str(exc))
    uvicorn.run(
        app,
        host=host or settings.api_host,
        port=settings.api_port if port is None else port,
        log_level=settings.log_level.lower(),
    )
