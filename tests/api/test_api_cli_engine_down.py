"""``cellsight api`` starts, for real (its own process, uvicorn), with the configured
search engine unreachable: it serves by fan-out and ``/readyz`` says why."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.api_world import World


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_api_process_starts_with_the_engine_unreachable(
    sqlite_world: World, tmp_path: Path
) -> None:
    port, dead = free_port(), free_port()  # nothing listens on ``dead``
    env = dict(os.environ)
    env.update(
        CELLSIGHT_DATA_DIR=str(tmp_path / "data"),
        CELLSIGHT_API_DB_URL=str(sqlite_world.registry.api_engine.url),
        CELLSIGHT_SEARCH_URL=f"http://127.0.0.1:{dead}",
        CELLSIGHT_SEARCH_TIMEOUT="1",
    )
    cli = Path(sys.executable).with_name("cellsight")
    process = subprocess.Popen(
        [str(cli), "api", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        ready = None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                ready = httpx.get(f"{base}/readyz", timeout=5)
                if ready.json()["index"]["probe"]["last_result"] != "not probed yet":
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        assert process.poll() is None, process.stdout.read().decode()[-2000:]  # type: ignore[union-attr]
        assert ready is not None and ready.status_code == 200, ready
        body = ready.json()
        assert body["path"] == "fanout" and body["safe_connect"]["flag"] is True
        assert body["index"]["probe"]["last_result"].startswith("unavailable")
        listing = httpx.get(
            f"{base}/v2.1/servers?all_tenants=1", headers={"X-Auth-Token": "root:admin"}
        )
        assert listing.status_code == 200 and listing.json()["servers"]
        assert listing.headers["X-Cellsight-Path"] == "fanout"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(15)
