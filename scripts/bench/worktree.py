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
    """``commit`` as a detached ``git worktree`` at ``where``, removed on exit; a commit
    git cannot check out ends the benchmark with git's own line."""
    added = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), commit],
        capture_output=True,
        text=True,
        check=False,
    )
    if added.returncode != 0:
        said = added.stderr.strip().splitlines() or [f"exit status {added.returncode}"]
        raise SystemExit(f"cannot check out {commit!r}: {said[-1]}")
    try:
        yield where
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)],
            check=False,
            capture_output=True,
        )
