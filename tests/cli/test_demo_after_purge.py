"""Found from outside: after ``index purge`` dropped the showcase's deleted server's
tombstone, every later ``demo`` waited 60 s for that document and failed: the demo
could never run again in that data directory (nor, with the default ``--older-than
30d``, a month after its first run)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.test_demo import instance_rows, run_demo

PURGE = ("index", "purge", "--older-than", "0d")


def test_the_demo_reruns_after_its_deleted_servers_tombstone_is_purged(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = run_demo(data, "--cells", "1", "--instances", "10")
    assert first.returncode == 0, first.stdout + first.stderr
    purge = subprocess.run(
        [sys.executable, "-m", "cellsight", "--data-dir", str(data), *PURGE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert purge.returncode == 0, purge.stdout + purge.stderr
    purged = re.search(r"purged (\d+) tombstone", purge.stdout)
    assert purged is not None and int(purged[1]) >= 1, purge.stdout  # the showcase's too

    again = run_demo(data)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "reusing the demo-web servers" in again.stdout
    assert "alice (project demo) sees 2 servers named ^demo" in again.stdout
    showcase = [r for r in instance_rows(data) if str(r["display_name"]).startswith("demo-web")]
    assert len(showcase) == 3  # nothing booted again
