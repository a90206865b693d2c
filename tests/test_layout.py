"""The distribution's shape: one import package, and imports that point one way.

The repository keeps one folder per part (``notifications/``, ``query/``, ``cells/``,
``indexer/``, ``api/``); ``cellsight/<part>`` is a symlink to each, so the installed
import names are ``cellsight.<part>`` for every tool alike (setuptools, the editable
finder, pytest, mypy, ruff) with no import hook or path mapping to keep in step.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("notifications", "query", "cells", "indexer", "api")

# What each part may import of ours. ``settings`` and ``clients`` are the root's bottom
# (typed settings; clients built in one place, importing what they build lazily), the
# CLI is on top. Everything else is a layering error.
ALLOWED: dict[str, set[str]] = {
    "settings": set(),
    "query": set(),
    "notifications": {"settings"},
    "cells": {"notifications", "query", "settings"},
    "indexer": {"notifications", "query", "cells", "settings"},
    "clients": {"settings", "notifications", "cells", "indexer"},
    "api": {"notifications", "query", "cells", "indexer", "settings", "clients"},
    "cli": {"notifications", "query", "cells", "indexer", "api", "settings", "clients"},
}


def _part_of(module: str) -> str | None:
    """``cellsight.indexer.engines.http`` → ``indexer``; ``cellsight.cli.x`` → ``cli``."""
    parts = module.split(".")
    if parts[0] != "cellsight" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in (*PARTS, "settings", "clients", "cli") else None


def _sources() -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {part: sorted((ROOT / part).rglob("*.py")) for part in PARTS}
    out["settings"] = [ROOT / "cellsight" / "settings.py"]
    out["clients"] = [ROOT / "cellsight" / "clients.py"]
    out["cli"] = sorted((ROOT / "cellsight" / "cli").rglob("*.py"))
    return out


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (lazy imports count too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for part, files in _sources().items():
        deps: set[str] = set()
        for path in files:
            for module in _imports(path):
                target = _part_of(module)
                if target and target != part:
                    deps.add(target)
        graph[part] = deps
    return graph


def test_no_module_imports_the_old_top_level_names() -> None:
    offenders = []
    for files in _sources().values():
        for path in files:
            for module in _imports(path):
                if module.split(".")[0] in PARTS:
                    offenders.append(f"{path.relative_to(ROOT)}: {module}")
    assert not offenders, offenders


def test_parts_import_only_what_lies_below_them() -> None:
    graph = package_graph()
    wrong = {part: sorted(deps - ALLOWED[part]) for part, deps in graph.items()}
    assert not {p: d for p, d in wrong.items() if d}, wrong
    # The facts the layering promises, stated directly.
    assert graph["query"] == set()
    assert graph["notifications"] <= {"settings"}


def test_the_package_graph_has_no_cycle() -> None:
    graph = package_graph()
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as exc:  # pragma: no cover - the assertion's message
        pytest.fail(f"import cycle between parts: {exc.args[1]}")
    assert order.index("query") < order.index("cells") < order.index("indexer")
    assert order.index("indexer") < order.index("api") < order.index("cli")


def test_the_graph_check_sees_a_wrong_import(tmp_path: Path) -> None:
    """The checker itself: an upward import in a part's source is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from cellsight.api.app import create_app\n")
    assert "cellsight.api.app" in _imports(bad)
    assert _part_of("cellsight.api.app") == "api"


def test_every_part_is_reached_through_the_one_package() -> None:
    for part in PARTS:
        link = ROOT / "cellsight" / part
        assert link.is_symlink() and link.resolve() == (ROOT / part).resolve()


def test_the_wheel_holds_only_cellsight(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("cellsight-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"cellsight"}
    # The parts arrive as real files inside the one package.
    for part in PARTS:
        assert f"cellsight/{part}/__init__.py" in names
    assert "cellsight/query/tree.py" in names
    assert "cellsight/indexer/engines/__init__.py" in names
