"""Issue 11's targets as the benchmarks report them: each with its verdict and, where
something outside the code caps it, the limit measured in the same run.

A target's ``status`` is ``met``; ``beyond_limit`` when it is missed, the limit
measured beside it is itself short of the threshold, and the value did not pass that
limit (so the limit bound it: the machine, not the code, stopped it in that run); or
``missed``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def target(
    name: str,
    value: float,
    threshold: float,
    op: str = ">=",
    limit: tuple[float, str] | None = None,
) -> dict[str, Any]:
    """A target's verdict; ``limit`` is (the best value this machine allows, what sets
    it), measured in the same run."""
    if op not in (">=", "<="):
        raise ValueError(f"op must be '>=' or '<=', not {op!r}")
    ok = value >= threshold if op == ">=" else value <= threshold
    out: dict[str, Any] = {
        "target": name,
        "value": value,
        "threshold": f"{op} {threshold:g}",
        "pass": bool(ok),
        "status": "met" if ok else "missed",
    }
    if limit is not None:
        best, what = limit
        beyond = best < threshold if op == ">=" else best > threshold
        out["limit"] = {
            "value": best,
            "set_by": what,
            "threshold_beyond_limit": bool(beyond),
            "share_of_limit": round(value / best, 3) if best else None,
        }
        binding = value <= best if op == ">=" else value >= best
        if not ok and beyond and binding:
            out["status"] = "beyond_limit"
    return out


def summary(targets: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """``all_pass`` (false when there is no target to pass), and the names of the
    targets by status."""
    found = list(targets)
    by_status: dict[str, list[str]] = {"met": [], "beyond_limit": [], "missed": []}
    for t in found:
        label = f"{t['engine']}: {t['target']}" if "engine" in t else t["target"]
        by_status[t["status"]].append(label)
    return {"all_pass": bool(found) and all(t["pass"] for t in found), "by_status": by_status}
