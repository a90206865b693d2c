"""The routing example (deploy/haproxy/nova-routing.cfg) run by a real HAProxy in
front of the Cellsight API and a stub nova-api: listings, query v2 and reservations
reach Cellsight, everything else reaches Nova unchanged."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import uvicorn

from cellsight.api.app import create_app
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.seed import seed
from cellsight.settings import load_settings
from tests.support.services import unavailable

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "nova-routing.cfg"
ADMIN = {"X-Auth-Token": "me:admin"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StubNova(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = json.dumps({"served_by": "nova", "method": self.command, "path": self.path})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


def wait_for(port: int, deadline: float = 30) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[str]:
    haproxy = shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None
    )
    if haproxy is None:
        reason = "haproxy not installed (Debian package haproxy; .ci/run installs it)"
        unavailable(reason)
    settings = load_settings(data_dir=tmp_path / "data")
    registry = CellRegistry.from_settings(settings)
    seed(registry, cells=1, instances_per_cell=30, cells_dir=settings.cells_dir)
    registry.close()
    api_port, nova_port, proxy_port = free_port(), free_port(), free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=api_port, log_level="warning")
    )
    api = threading.Thread(target=server.run, daemon=True)
    api.start()
    nova = ThreadingHTTPServer(("127.0.0.1", nova_port), StubNova)
    threading.Thread(target=nova.serve_forever, daemon=True).start()
    env = {
        **os.environ,
        "PROXY_BIND": f"127.0.0.1:{proxy_port}",
        "CELLSIGHT_BACKEND": f"127.0.0.1:{api_port}",
        "NOVA_BACKEND": f"127.0.0.1:{nova_port}",
    }
    checked = subprocess.run([haproxy, "-c", "-f", str(CONFIG)], env=env, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    process = subprocess.Popen(
        [haproxy, "-db", "-f", str(CONFIG)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(api_port)
        wait_for(proxy_port)
        yield f"http://127.0.0.1:{proxy_port}"
    finally:
        process.terminate()
        process.wait(10)
        nova.shutdown()
        server.should_exit = True
        api.join(10)


def call(
    url: str, method: str = "GET", body: dict[str, object] | None = None
) -> tuple[int, dict[str, object]]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=ADMIN)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.mark.parametrize(
    "path",
    [
        "/v2.1/servers?all_tenants=1&limit=3",
        "/v2.1/servers/detail?all_tenants=1&limit=3",
        "/v2.1/admin/servers/detail?all_tenants=1&limit=3",
        "/v2.1/servers/detail/?all_tenants=1",
    ],
)
def test_server_listings_go_to_cellsight(proxy: str, path: str) -> None:
    status, body = call(proxy + path)
    assert status == 200, body
    assert "served_by" not in body
    assert isinstance(body["servers"], list) and body["servers"]


def test_query_v2_goes_to_cellsight(proxy: str) -> None:
    status, body = call(proxy + "/v2.1/query/instances", "POST", {"limit": 2})
    assert body.get("served_by") != "nova", body
    assert status < 500


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v2.1/servers/0b3a6c1e-0000-4000-8000-000000000001"),
        ("POST", "/v2.1/servers"),
        ("DELETE", "/v2.1/servers/0b3a6c1e-0000-4000-8000-000000000001"),
        ("POST", "/v2.1/servers/0b3a6c1e-0000-4000-8000-000000000001/action"),
        ("GET", "/v2.1/flavors/detail"),
        ("GET", "/v2.1/os-hypervisors"),
        ("PUT", "/v2.1/servers/detail"),
    ],
)
def test_everything_else_goes_to_nova(proxy: str, method: str, path: str) -> None:
    status, body = call(proxy + path, method, {"server": {}} if method in ("POST", "PUT") else None)
    assert status == 200
    assert body == {"served_by": "nova", "method": method, "path": path}
