"""``GET /healthz``: which path serves listings and why (no authentication: it says
nothing about any instance)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from api.paths import InstanceSearch

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Which path serves listings, and why")
def healthz(request: Request) -> dict[str, Any]:
    search: InstanceSearch = request.app.state.search
    return {"status": "ok", **search.status()}
