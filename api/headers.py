"""Cellsight's own response headers.

* ``X-Cellsight-Path``: ``index`` or ``fanout``, the path that answered.
* ``X-Cellsight-Skipped-Cells``: the cells a fan-out skipped, comma-separated, each
  ``name;uuid=…;reason=timeout|error`` (the name percent-encoded); to a caller who is no
  administrator each is ``cell;reason=…``, since Nova shows no cell to its users (an
  authorization probe). Absent when every cell answered.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

from cellsight.api.fanout import SkippedCell

PATH = "X-Cellsight-Path"
SKIPPED_CELLS = "X-Cellsight-Skipped-Cells"


def skipped_cells(skipped: Sequence[SkippedCell], *, admin: bool) -> str:
    if not admin:
        return ", ".join(f"cell;reason={s.reason}" for s in skipped)
    return ", ".join(f"{quote(s.name, safe='')};uuid={s.uuid};reason={s.reason}" for s in skipped)


def named_cell(name: str, *, admin: bool) -> str:
    """`` (name)`` after "the cell" in a message to an administrator; nothing to others."""
    return f" ({name})" if admin else ""


def parse_skipped(value: str | None) -> list[tuple[str, str, str]]:
    """(name, uuid, reason) of each skipped cell, for clients and tests."""
    out = []
    for part in (value or "").split(","):
        if not part.strip():
            continue
        name, *attrs = part.strip().split(";")
        fields = dict(a.split("=", 1) for a in attrs if "=" in a)
        out.append((name, fields.get("uuid", ""), fields.get("reason", "")))
    return out
