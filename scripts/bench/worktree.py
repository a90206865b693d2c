"""Another commit of this repository checked out beside it, for benchmarks that run it
in the same minutes as this checkout (machines here drift too much between runs for a
figure measured on another day to compare with)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def worktree(commit: str, where: Path) -> Iterator[Path]:
    """``commit`` as a detached ``git worktree`` at ``where``, removed on exit."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), commit],
        check=True,
        capture_output=True,
    )
    try:
        yield where
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)],
            check=False,
            capture_output=True,
        )
