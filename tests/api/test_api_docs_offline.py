"""The OpenAPI docs render on a closed network: /docs and /redoc reference only assets
the API serves itself (from the ``fastapi-offline`` package), never a CDN."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from cellsight.api.app import create_app
from cellsight.settings import load_settings

ASSET = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|url\(['"]?([^'")]+)['"]?\)""")


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    return TestClient(create_app(load_settings(data_dir=tmp_path / "data")))


@pytest.mark.parametrize(
    ("page", "expected_assets"),
    [("/docs", {".js", ".css"}), ("/redoc", {".js"})],
)
def test_docs_page_and_every_asset_come_from_the_api(
    client: TestClient, page: str, expected_assets: set[str]
) -> None:
    response = client.get(page)
    assert response.status_code == 200
    assert "text/html" in response.headers["content-type"]
    html = response.text
    assert "cdn." not in html and "googleapis" not in html and "unpkg" not in html
    urls = {a or b for a, b in ASSET.findall(html)}
    # the OpenAPI document is referenced by a JS string, not an attribute
    assert "/openapi.json" in html
    assert urls, html
    kinds = {Path(u).suffix for u in urls}
    assert expected_assets <= kinds, urls
    for url in urls:
        assert url.startswith("/"), f"{page} references an outside asset: {url}"
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 100, url
    spec = client.get("/openapi.json")
    assert spec.status_code == 200 and spec.json()["info"]["title"] == "Cellsight"


def test_the_swagger_bundle_is_the_real_ui(client: TestClient) -> None:
    html = client.get("/docs").text
    js = next(u for a, b in ASSET.findall(html) if (u := a or b).endswith(".js"))
    body = client.get(js).text
    assert "SwaggerUIBundle" in body and len(body) > 500_000
