"""``POST /v2.1/os-cellsight/nodes/refresh`` (administrators): snapshot every cell's
nodes into the node state cache now; answers what it read and how long it took."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import State

from cellsight.api.auth import Principal, current_principal
from cellsight.api.errors import Forbidden
from cellsight.api.query2.nodes import node_cache

router = APIRouter(tags=["nodes"])


def refresh_summary(state: State) -> dict[str, Any]:
    started = time.perf_counter()
    snapshot = node_cache(state).refresh()
    return {
        "nodes": len(snapshot.documents),
        "source": snapshot.source,
        "skipped_cells": [s.name for s in snapshot.skipped_cells],
        "seconds": round(time.perf_counter() - started, 6),
    }


@router.post("/v2.1/os-cellsight/nodes/refresh", summary="Refill the node state cache")
async def refresh(request: Request, principal: Principal = Depends(current_principal)) -> Any:
    if not principal.is_admin:
        raise Forbidden("Refreshing the node cache is admin-only")
    return await run_in_threadpool(refresh_summary, request.app.state)
