"""``cellsight --help`` stays quick because building the command tree imports none of
the heavy parts (measured by ``scripts/bench_cli_startup.py``; asserted here as a
property, not a time). A module-level import of the bus, the settings or the app in any
command module breaks it, as one did: ``--help`` went from 0.3 s to 0.9 s."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = (
    "pydantic_settings",
    "kombu",
    "redis",
    "sqlalchemy",
    "fastapi",
    "uvicorn",
    "elasticsearch",
    "opensearchpy",
    "msgspec",
    "cellsight.settings",
    "cellsight.notifications.bus",
    "cellsight.api",
    "cellsight.indexer",
    "cellsight.cells",
    "urllib.request",  # http.client and email with it: only `--url` needs them
)

PROBE = """
import json, sys
from typer.main import get_command
import cellsight.cli as cli
get_command(cli.app)  # what --help builds: every group and command registered
print(json.dumps(sorted(m for m in sys.modules)))
"""


def test_building_the_command_tree_imports_nothing_heavy() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = set(json.loads(out.stdout))
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY or m in HEAVY)
    heavy += sorted(m for m in loaded for h in HEAVY if "." in h and m.startswith(h + "."))
    assert not heavy, f"imported at startup: {sorted(set(heavy))}"
