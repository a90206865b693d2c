"""``cellsight api`` is registered and serves the app (uvicorn is not started here)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from cellsight.api.app import create_app
from cellsight.cli import _register, app
from cellsight.settings import load_settings


def test_api_command_runs_uvicorn_with_the_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    seen: dict[str, Any] = {}

    def fake_run(served: Any, **kwargs: Any) -> None:
        seen.update(kwargs, app=served)

    monkeypatch.setattr(uvicorn, "run", fake_run)
    _register()
    result = CliRunner().invoke(
        app, ["--data-dir", str(tmp_path), "api", "--host", "127.0.0.2", "--port", "9999"]
    )
    assert result.exit_code == 0, result.output
    assert seen["host"] == "127.0.0.2" and seen["port"] == 9999
    frozen = gc.get_freeze_count()
    try:
        with TestClient(seen["app"]) as client:
            # The served app's startup objects are out of the collector's reach.
            assert gc.get_freeze_count() > frozen
            spec = client.get("/openapi.json")
    finally:
        gc.unfreeze()  # the rest of the test session collects as usual
    assert spec.status_code == 200
    assert {"/v2.1/servers", "/v2.1/servers/detail", "/healthz"} <= spec.json()["paths"].keys()


def test_an_app_for_tests_or_the_demo_leaves_the_collector_as_it_is(tmp_path: Path) -> None:
    frozen = gc.get_freeze_count()
    with TestClient(create_app(load_settings(data_dir=tmp_path))) as client:
        assert client.get("/healthz").status_code in (200, 503)
    assert gc.get_freeze_count() == frozen
