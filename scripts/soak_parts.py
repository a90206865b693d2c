"""Parts of the soak (``scripts/soak.py``): child processes, a TCP proxy that can cut a
cell off, RSS sampling, latency summaries and the row-by-row index check."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from bench.measure import rss_mb

ROOT = Path(__file__).resolve().parents[1]


class Child:
    """A ``cellsight`` subprocess with its output in a log file."""

    def __init__(self, role: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.role, self.argv, self.env, self.log_dir = role, argv, env, log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None or self.proc.poll() is not None else self.proc.pid

    def start(self, ready: Callable[[str], bool], timeout: float = 60.0) -> None:
        self.starts += 1
        path = self.log_dir / f"{self.role}-{self.starts}.log"
        self._log = open(path, "wb")  # noqa: SIM115 - closed in stop()/kill()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cellsight", *self.argv],
            env=self.env,
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while not ready(path.read_text(errors="replace")):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.role} did not start: {path.read_text()[-2000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self._close_log()

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._close_log()
        return self.proc.returncode

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class Proxy:
    """A TCP proxy to a database server; ``cut()`` makes the cell behind it unreachable
    (live connections closed, new ones reset) until ``restore()``."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.up = True
        self._live: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="proxy").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._live |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        with self._lock:
            self._live -= {src, dst}

    def cut(self) -> None:
        self.up = False
        with self._lock:
            live, self._live = list(self._live), set()
        for s in live:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self.cut()
        self.listener.close()


class RssMonitor(threading.Thread):
    """Samples each role's RSS every second and keeps the maximum."""

    def __init__(self, pids: Callable[[], dict[str, int | None]]) -> None:
        super().__init__(daemon=True, name="rss")
        self.pids = pids
        self.peak: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            for role, pid in self.pids().items():
                value = None if pid is None else rss_mb(pid)
                if value is not None:
                    self.peak[role] = max(self.peak.get(role, 0.0), round(value, 1))


def latency_summary(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2)

    return {
        "count": len(ordered),
        "p50_ms": pct(0.5),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


def wait_gone(pid: int, timeout: float = 30.0) -> None:
    """Until ``pid`` has exited (or is a zombie nobody reaps yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return
        time.sleep(0.05)
    raise RuntimeError(f"pid {pid} did not exit in {timeout}s")


def child_env(overrides: dict[str, str]) -> dict[str, Any]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **overrides}


def answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def verdict(summary: dict[str, Any], rss_limit: float) -> dict[str, bool]:
    lists = {k: v for k, v in summary["responses"].items() if k.startswith(("list", "query"))}
    return {
        # Equal before anti-entropy runs: the embedded bus loses nothing to an indexer
        # SIGKILL or a restart of its server (what was taken and unrecorded comes back
        # off its landing, see notifications/redis_landing.py); and after it.
        "index_equals_cells": summary["index_checked"]
        and summary["outbox_left"] == 0
        and summary["index_differences"] == 0
        and summary["index_differences_after_verify"] == 0,
        "every_response_200": all(
            k.split()[1] == "200" and k.split()[2] in ("index", "fanout") for k in lists
        )
        and bool(lists),
        "only_poison_dead_lettered": summary["dead_letters_unexpected"] == 0
        and summary["poison_missing"] == 0,
        "rss_within_bound": all(v <= rss_limit for v in summary["rss_peak_mb"].values()),
        "no_unexpected_errors": not summary["errors"],
    }
