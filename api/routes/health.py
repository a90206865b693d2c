"""Liveness and readiness (no authentication: they say nothing about any instance).

``/healthz``: the process is up and answering (always 200 while it is), with the
path summary it always gave.
``/readyz``: which path serves listings and why, each cell's state (every column of
its ``instances`` table asked for, no row, under the cell deadline), the index's state
and the background prober's last result, the safe-connect flag and the next probe. 503
only when neither path can serve: the index is not serving and no cell answers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cellsight.api.driver_errors import API_DB_FAILURES
from cellsight.api.errors import unavailable
from cellsight.api.fanout import FanOut, Saturated
from cellsight.api.index_probe import IndexProber
from cellsight.api.metrics import ApiMetrics
from cellsight.api.paths import InstanceSearch
from cellsight.cells.schema import instances

router = APIRouter(tags=["health"])

READY_TTL = 1.0  # seconds a readiness read of the cells answers every /readyz


class CellStates:
    """The cells' states as ``/readyz`` last read them, for ``READY_TTL`` seconds: the
    endpoint takes no token, and a query in every cell per request let anyone load the
    cells (a resource-exhaustion probe: 195 requests/s took a member's listing from 12
    to 663 ms). One read at a time; callers meanwhile wait for it and share it."""

    def __init__(self, ttl: float = READY_TTL, clock: Callable[[], float] = time.monotonic):
        self.ttl = ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._value: tuple[str, list[dict[str, Any]]] = ("down", [])

    def get(
        self, read: Callable[[], tuple[str, list[dict[str, Any]]]]
    ) -> tuple[str, list[dict[str, Any]]]:
        with self._lock:
            if self._read_at is None or self.clock() - self._read_at >= self.ttl:
                self._value = read()
                self._read_at = self.clock()
            return self._value


@router.get("/healthz", summary="Liveness: the process answers (and which path serves)")
def healthz(request: Request) -> dict[str, Any]:
    search: InstanceSearch = request.app.state.search
    return {"status": "ok", **search.status()}


def _cells(search: InstanceSearch, fanout: FanOut) -> tuple[str, list[dict[str, Any]]]:
    try:
        cells = search.registry.list_cells()
    except API_DB_FAILURES as exc:
        unavailable("readiness: the API database is unavailable", exc)
        return "down", []
    try:
        # Every column the listings read, no row: the cell answers, and its schema is
        # whole (a cell that lost a column is skipped by every listing; it is no "up").
        probe = sa.select(*instances.c).where(sa.false())
        answered = fanout.map_cells(
            cells, lambda cell, conn: conn.execute(probe).all(), count_skipped=False
        )
    except Saturated:
        answered = None
    states = {c.uuid: "busy" for c in cells}
    if answered is not None:
        states = {uuid: "up" for uuid in answered.results}
        states.update({s.uuid: s.reason for s in answered.skipped})
    # A disabled cell is listed and answers as any other; it only takes no new instance.
    return "up", [
        {"name": c.name, "uuid": c.uuid, "state": states[c.uuid], "disabled": c.disabled}
        for c in cells
    ]


@router.get(
    "/readyz",
    summary="Readiness: which path serves, cells, index, safe-connect flag",
    responses={503: {"description": "Neither the index nor any cell can serve"}},
)
def readyz(request: Request) -> JSONResponse:
    state = request.app.state
    search: InstanceSearch = state.search
    prober: IndexProber = state.prober
    status = search.status()
    api_db, cells = state.cell_states.get(lambda: _cells(search, state.fanout))
    any_cell = any(c["state"] in ("up", "busy") for c in cells)
    ready = status["path"] == "index" or any_cell
    body = {
        "status": "ready" if ready else "unavailable",
        "path": status["path"] if status["path"] == "index" or not any_cell else "fanout",
        "reason": status["reason"],
        "index": {
            "engine": status["engine"],
            "synced": status["synced"],
            "probe": prober.status(),
        },
        "safe_connect": status["safe_connect"],
        "api_database": api_db,
        "cells": cells,
    }
    if not ready:
        body["path"] = "none"
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get(
    "/metrics",
    summary="Prometheus metrics of this API process",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
def metrics(request: Request) -> Response:
    registry: ApiMetrics = request.app.state.metrics
    return Response(generate_latest(registry.registry), media_type=CONTENT_TYPE_LATEST)
