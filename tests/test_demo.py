"""The README's first command: the demo runs the whole system on the embedded defaults."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_demo_seeds_syncs_indexes_and_serves_from_the_index(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cellsight",
            "--data-dir",
            str(tmp_path / "data"),
            "demo",
            "--cells",
            "2",
            "--instances",
            "200",
            "--no-serve",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "seeded 2 cells" in out
    assert "instance: 400 documents" in out
    assert "'dead': 0" in out
    assert '"path": "index"' in out  # synced: the API answers from the index
    assert "alice (project demo) sees 2 servers named ^demo" in out  # 3 booted, 1 deleted
    assert "embedded bus stopped" in result.stderr  # nothing left running
