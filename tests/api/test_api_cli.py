"""``cellsight api`` is registered and serves the app (uvicorn is not started here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from cellsight.cli import _register, app


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
    with TestClient(seen["app"]) as client:
        spec = client.get("/openapi.json")
    assert spec.status_code == 200
    assert {"/v2.1/servers", "/v2.1/servers/detail", "/healthz"} <= spec.json()["paths"].keys()
