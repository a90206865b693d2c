"""The app factory. What it puts on ``app.state`` is documented in ``api/__init__``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from api import errors
from api.auth import Authenticator
from api.fanout import FanOut
from api.paths import InstanceSearch
from api.routes import health, query, servers, versions
from api.safe_connect import SafeConnect
from cells.database import Engines
from cells.errors import DatabaseUnavailable
from cells.mappings import CellRegistry
from cellsight.settings import Settings
from indexer.engines.base import SearchEngine


def create_app(
    settings: Settings,
    *,
    engine: SearchEngine | None = None,
    registry: CellRegistry | None = None,
) -> FastAPI:
    """The API. ``engine`` and ``registry`` default to the configured ones (and are
    then closed with the app); given ones are left to their owner."""
    owned_engine = engine is None
    owned_registry = registry is None
    if engine is None:
        from cellsight.clients import build_engine

        engine = build_engine(settings)
    if registry is None:
        registry = CellRegistry(
            settings.resolved_api_db_url,
            Engines(
                connect_timeout=settings.db_connect_timeout,
                statement_timeout=settings.cell_timeout,
            ),
        )
    fanout = FanOut(cell_timeout=settings.cell_timeout, connect_timeout=settings.db_connect_timeout)
    safe_connect = SafeConnect(settings.safe_connect_cooldown)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        fanout.close()
        if owned_engine:
            engine.close()
        if owned_registry:
            registry.close()

    app = FastAPI(
        title="Cellsight",
        summary="List and query the instances of a multi-cell cluster",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.registry = registry
    app.state.engine = engine
    app.state.authenticator = Authenticator.from_settings(settings)
    app.state.safe_connect = safe_connect
    app.state.fanout = fanout
    app.state.search = InstanceSearch(registry, engine, fanout, safe_connect)
    errors.install(app)

    @app.exception_handler(DatabaseUnavailable)
    async def _database_down(request: Request, exc: DatabaseUnavailable) -> JSONResponse:
        return errors.fault_response(503, f"A database is unavailable: {exc.why}")

    app.include_router(versions.router)
    app.include_router(health.router)
    app.include_router(servers.router)
    app.include_router(query.router)
    return app
