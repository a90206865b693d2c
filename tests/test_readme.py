"""The README stays true: its configuration table is the one the Settings class
generates, and it has one performance section."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cellsight.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def test_the_configuration_table_matches_the_settings() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "settings_table.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    readme = (ROOT / "README.md").read_text()
    for name in Settings.model_fields:
        assert f"`CELLSIGHT_{name.upper()}`" in readme, name


def test_one_performance_section_and_the_demo_address() -> None:
    readme = (ROOT / "README.md").read_text()
    headings = [line for line in readme.splitlines() if line.startswith("#")]
    assert sum(1 for h in headings if "performance" in h.lower()) == 1, headings
    assert readme.count("**Server list**") == 1 and readme.count("**Indexer**") == 1
    assert "127.0.0.1:8774" in readme and "--port" in readme
