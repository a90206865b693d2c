"""``cellsight indexer`` whose engine does not answer as it starts: a transient failure
is retried for about half a minute (a probe: a seven-second stall of the engine took
every worker down, exit 1, and nothing indexed what piled up), and a SIGTERM meanwhile
stops it cleanly. Run as the operator runs it: a subprocess of the entry point, with
osmem behind a proxy that refuses connections until the test lets them through."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.proxy import Proxy
from tests.support.waiting import wait_for

pytestmark = pytest.mark.services


def _indexer(tmp_path: Path, url: str, *args: str) -> subprocess.Popen[str]:
    """Its output in ``out`` and ``err`` under ``tmp_path``, read while it runs."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CELLSIGHT_")}
    return subprocess.Popen(
        [sys.executable, "-m", "cellsight", "--data-dir", str(tmp_path / "data"),
         "indexer", *args],
        stdout=(tmp_path / "out").open("w"),
        stderr=(tmp_path / "err").open("w"),
        text=True,
        env={**clean, "CELLSIGHT_SEARCH_URL": url, "PYTHONUNBUFFERED": "1"},
        cwd=tmp_path,
        start_new_session=True,
    )  # fmt: skip


def _stopped(proc: subprocess.Popen[str], tmp_path: Path) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return proc.returncode, _said(tmp_path, "out"), _said(tmp_path, "err")


def _said(tmp_path: Path, stream: str) -> str:
    return (tmp_path / stream).read_text()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_engine_that_answers_late_is_waited_for(
    tmp_path: Path, osmem_url: str, workers: str
) -> None:
    target = urlsplit(osmem_url)
    proxy = Proxy((target.hostname or "127.0.0.1", target.port or 80))
    proxy.start()
    proxy.stop()  # refused, as an engine restarting
    url = f"http://127.0.0.1:{proxy.port}"
    proc = _indexer(tmp_path, url, "--workers", workers)
    try:
        wait_for(lambda: "retry 1 of" in _said(tmp_path, "err") or proc.poll() is not None, 60,
                 "a retry")  # fmt: skip
        assert proc.poll() is None, _said(tmp_path, "err")
        proxy.start()
        consuming = ("engine, queue" in _said(tmp_path, "out") for _ in iter(int, 1))
        wait_for(lambda: next(consuming) or proc.poll() is not None, 60, "consuming")
        assert proc.poll() is None, _said(tmp_path, "err")
        code, out, err = _stopped(proc, tmp_path)
    finally:
        proxy.stop()
    assert code == 0, (out, err)
    assert "Traceback" not in err, err


def test_a_sigterm_while_the_engine_is_waited_for_stops_it(tmp_path: Path) -> None:
    proxy = Proxy(("127.0.0.1", 9))
    proxy.start()
    proxy.stop()
    proc = _indexer(tmp_path, f"http://127.0.0.1:{proxy.port}")
    wait_for(lambda: "retry 1 of" in _said(tmp_path, "err") or proc.poll() is not None, 60,
             "a retry")  # fmt: skip
    code, out, err = _stopped(proc, tmp_path)
    assert code == 0, (out, err)
    assert "indexer stopped before its engine answered" in out
    assert "error" not in err and "Traceback" not in err, err
