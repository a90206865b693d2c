"""The app factory. What it puts on ``app.state`` is documented in ``api/__init__``."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager
from typing import cast

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline

from cellsight.api import errors, openapi
from cellsight.api.auth import Authenticator
from cellsight.api.fanout import FanOut
from cellsight.api.index_probe import DeferredEngine, IndexProber
from cellsight.api.metrics import ApiMetrics, RequestTimer
from cellsight.api.paths import InstanceSearch
from cellsight.api.raw_paths import PathSegmentsAsData
from cellsight.api.routes import health, nodes, query, reservations, servers, versions
from cellsight.api.safe_connect import SafeConnect
from cellsight.cells.database import Engines
from cellsight.cells.errors import DatabaseUnavailable
from cellsight.cells.mappings import CellRegistry
from cellsight.indexer.engines.base import SearchEngine
from cellsight.settings import Settings

# Seconds the API's start waits for its first index probe: an engine that answers takes
# milliseconds; one that does not is left to the prober, and requests go to the cells.
FIRST_PROBE_WAIT = 2.0


def create_app(
    settings: Settings,
    *,
    engine: SearchEngine | None = None,
    registry: CellRegistry | None = None,
    freeze_startup: bool = False,
) -> FastAPI:
    """The API. ``engine`` and ``registry`` default to the configured ones (and are
    then closed with the app); given ones are left to their owner. The configured
    engine is connected in the background: the app starts whatever its state. With
    ``freeze_startup`` (a process that only serves the API, as ``cellsight api``) the
    objects alive once the app has started are moved out of the cycle collector's reach
    (``freeze_startup_objects``)."""
    owned_engine = engine is None
    owned_registry = registry is None
    if engine is None:
        from cellsight.clients import build_engine

        engine = cast(SearchEngine, DeferredEngine(lambda: build_engine(settings)))
    if registry is None:
        registry = CellRegistry(
            settings.resolved_api_db_url,
            Engines(
                connect_timeout=settings.db_connect_timeout,
                statement_timeout=settings.cell_timeout,
            ),
        )
        # Its reservations reclaim a dead build's uuid after the builds' bound, not its own.
        registry.build_timeout = settings.db_statement_timeout
    metrics = ApiMetrics()
    fanout = FanOut(
        cell_timeout=settings.cell_timeout,
        connect_timeout=settings.db_connect_timeout,
        max_workers=settings.fanout_workers,
        admission_wait=settings.fanout_admission_wait,
        metrics=metrics,
    )
    safe_connect = SafeConnect(settings.safe_connect_cooldown)
    metrics.safe_connect.set_function(lambda: 1.0 if safe_connect.flagged else 0.0)
    search = InstanceSearch(
        registry,
        engine,
        fanout,
        safe_connect,
        metrics,
        per_project_cells=settings.instance_list_per_project_cells,
        index_searches=settings.index_searches,
        admission_wait=settings.fanout_admission_wait,
    )

    served = False  # the index has answered a probe since start

    def probe() -> str:
        nonlocal served
        result = search.probe()
        served = served or not safe_connect.flagged
        return result

    def probes_held() -> float:
        """Seconds the safe-connect flag still holds probes back: none when it is not
        set or its probe is due; for ever (an hour at a time) with no cool-down, once
        the index has served (an API started before its engine still connects)."""
        wait = safe_connect.next_probe_in()
        if wait is None or (safe_connect.cooldown == 0 and not served):
            return 0.0
        return 3600.0 if safe_connect.cooldown == 0 else wait

    def next_probe_delay() -> float:
        return probes_held() or settings.index_probe_interval

    prober = IndexProber(probe, next_probe_delay, metrics, held=probes_held)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        safe_connect.request_probes = False
        prober.start()
        # The first requests wait for the first probe (bounded): before it, the engine
        # is not connected, and they were answered from the cells and set the
        # safe-connect flag on an index that answered a moment later (a parity probe).
        await asyncio.to_thread(prober.first_probe_done.wait, FIRST_PROBE_WAIT)
        if freeze_startup:
            freeze_startup_objects()
        yield
        prober.stop()
        app.state.resources.close()  # what requests opened on first use (the notifier)
        fanout.close()
        if owned_engine:
            engine.close()
        if owned_registry:
            registry.close()

    # /docs and /redoc with their assets served from the package: they work offline
    app = FastAPIOffline(
        title="Cellsight",
        summary="List and query the instances of a multi-cell cluster",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.resources = ExitStack()
    app.state.registry = registry
    app.state.engine = engine
    app.state.authenticator = Authenticator.from_settings(settings)
    app.state.safe_connect = safe_connect
    app.state.fanout = fanout
    app.state.search = search
    app.state.prober = prober
    app.state.cell_states = health.CellStates()
    app.state.metrics = metrics
    app.add_middleware(RequestTimer, metrics=metrics)
    app.add_middleware(PathSegmentsAsData)
    errors.install(app)
    openapi.install(app)

    @app.exception_handler(DatabaseUnavailable)
    async def _database_down(request: Request, exc: DatabaseUnavailable) -> JSONResponse:
        failure = errors.unavailable("A database is unavailable", exc)
        return errors.fault_response(503, failure.message)

    app.include_router(versions.router)
    app.include_router(health.router)
    app.include_router(servers.router)
    app.include_router(query.router)
    app.include_router(reservations.router)
    app.include_router(nodes.router)
    return app


def freeze_startup_objects() -> None:
    """Collect once, then freeze what is alive (modules, classes, the app and its
    clients: about 140,000 objects): the collector's full passes, which a page of 1,000
    servers' documents sets off, then walk only what requests made. Measured on a walk
    of 30 pages of 1,000 servers: every other page had taken 60-90 ms longer (a full
    pass), p50 71 ms and max 154 ms, against 59 ms and 85 ms frozen. What is frozen is
    never collected; what starts with the app lives as long as it."""
    gc.collect()
    gc.freeze()
