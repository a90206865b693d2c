"""The README's first command: ``cellsight demo`` runs the whole system on the embedded
defaults, as a subprocess the way an operator runs it (on a free port)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.services import embedded_redis_servers

CURL = re.compile(r"curl -H '([^:']+): ([^']+)' '([^']+)'")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def demo_command(data: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "cellsight", "--data-dir", str(data), "demo", *args]


def run_demo(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        demo_command(data, "--no-serve", "--port", "0", *args),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=data.parent,
    )


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.read()


def instance_rows(data: Path) -> list[dict[str, Any]]:
    from cellsight.cells.database import connect
    from cellsight.cells.mappings import CellRegistry
    from cellsight.cells.reads import iter_instances
    from cellsight.settings import load_settings

    registry = CellRegistry.from_settings(load_settings(data_dir=data))
    try:
        rows: list[dict[str, Any]] = []
        for cell in registry.list_cells():
            with connect(registry.cell_engine(cell)) as conn:
                rows.extend(dict(r) for r in iter_instances(conn, include_deleted=True))
        return rows
    finally:
        registry.close()


def processes_using(path: Path) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(path) in cmdline:
                found.append(cmdline)
    return found


def test_demo_serves_a_live_cluster_and_one_ctrl_c_stops_everything(tmp_path: Path) -> None:
    data, port, out = tmp_path / "data", free_port(), tmp_path / "demo.out"
    args = ["--cells", "2", "--instances", "150", "--port", str(port), "--interval", "0.1"]
    with out.open("w") as sink:
        proc = subprocess.Popen(
            demo_command(data, *args), stdout=sink, stderr=subprocess.STDOUT, cwd=tmp_path
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while "curl " not in out.read_text():
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, "the demo did not come up: " + out.read_text()
            time.sleep(0.2)
        status, health = get(f"{base}/healthz")
        assert status == 200 and json.loads(health)["path"] == "index"
        text = out.read_text()
        assert f"{base}/docs" in text and "/metrics" in text

        curls = CURL.findall(text)
        assert len(curls) == 2, text
        for header, value, url in curls:
            status, body = get(url, {header: value})
            assert status == 200 and json.loads(body)["servers"], url

        header, value, url = curls[0]  # newest changes first
        first = json.loads(get(url, {header: value})[1])
        deadline = time.monotonic() + 30
        while json.loads(get(url, {header: value})[1]) == first:
            assert time.monotonic() < deadline, "the listing did not change in 30 s"
            time.sleep(0.5)

        metrics_url = re.search(r"metrics: (\S+)", text)
        assert metrics_url is not None
        assert b"cellsight_indexer_consumed" in get(metrics_url.group(1))[1]
        assert get(f"{base}/docs")[0] == 200

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "live operations:" in out.read_text()
    assert not embedded_redis_servers(tmp_path), "the embedded bus outlived the demo"
    assert not processes_using(data), processes_using(data)
    with pytest.raises(urllib.error.URLError):
        get(f"{base}/healthz")


def test_demo_reruns_without_duplicates_and_fresh_starts_over(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = run_demo(data, "--cells", "2", "--instances", "100")
    assert first.returncode == 0, first.stdout + first.stderr
    out = first.stdout
    assert "seeded 2 cells" in out
    assert "instance: 200 documents" in out
    assert re.search(r"^indexer: indexed=\d+ stale=\d+ ignored=\d+ dead=0$", out, re.M)
    assert '"path": "index"' in out  # synced: the API answers from the index
    assert "alice (project demo) sees 2 servers named ^demo" in out  # 3 booted, 1 deleted
    rows = instance_rows(data)
    assert len(rows) == 203
    assert sum(1 for r in rows if str(r["display_name"]).startswith("demo-web")) == 3

    again = run_demo(data, "--cells", "2", "--instances", "100")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "seeded" not in again.stdout and "reusing 2 cells" in again.stdout
    assert "alice (project demo) sees 2 servers named ^demo" in again.stdout
    assert sorted(r["uuid"] for r in instance_rows(data)) == sorted(r["uuid"] for r in rows)

    fresh = run_demo(data, "--cells", "1", "--instances", "50", "--fresh")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert "seeded 1 cell (" in fresh.stdout
    new_rows = instance_rows(data)
    assert len(new_rows) == 53
    assert not {r["uuid"] for r in new_rows} & {r["uuid"] for r in rows}
    assert not embedded_redis_servers(tmp_path)


def test_demo_on_a_busy_port_is_one_line_naming_the_option(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            demo_command(tmp_path / "data", "--port", str(port), "--cells", "1"),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
    assert result.returncode == 2, result.stdout + result.stderr
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "--port" in err
    assert not (tmp_path / "data").exists()  # refused before doing anything
