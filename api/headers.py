"""Cellsight's own response headers.

* ``X-Cellsight-Path``: ``index`` or ``fanout``, the path that answered.
* ``X-Cellsight-Skipped-Cells``: the cells a fan-out skipped, comma-separated, each
  ``name;uuid=…;reason=timeout|error`` (the name percent-encoded). Absent when every
  cell answered.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

from cellsight.api.fanout import SkippedCell

PATH = "X-Cellsight-Path"
SKIPPED_CELLS = "X-Cellsight-Skipped-Cells"


def skipped_cells(skipped: Sequence[SkippedCell]) -> str:
    return ", ".join(f"{quote(s.name, safe='')};uuid={s.uuid};reason={s.reason}" for s in skipped)


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
