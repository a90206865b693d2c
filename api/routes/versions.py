"""The compute API's version documents, which clients read for version discovery."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from cellsight.api import microversion

router = APIRouter(tags=["versions"])


def _version(request: Request) -> dict[str, Any]:
    base = str(request.base_url).rstrip("/")
    return {
        "id": "v2.1",
        "status": "CURRENT",
        "version": str(microversion.MAX),
        "min_version": str(microversion.MIN),
        "updated": "2013-07-23T11:33:21Z",
        "links": [{"rel": "self", "href": f"{base}/v2.1/"}],
        "media-types": [
            {
                "base": "application/json",
                "type": "application/vnd.openstack.compute+json;version=2.1",
            }
        ],
    }


@router.get("/", summary="API versions")
def versions(request: Request) -> dict[str, Any]:
    return {"versions": [_version(request)]}


@router.get("/v2.1", summary="The v2.1 API version")
@router.get("/v2.1/", include_in_schema=False)
def version(request: Request) -> dict[str, Any]:
    return {"version": _version(request)}
