"""The benchmarks' ceiling and floor phases run their writes as the writer process runs
its commits: automatic cycle collection off, a collector pass between batches, and the
process's own setting restored afterwards."""

from __future__ import annotations

import gc
import importlib
from pathlib import Path
from typing import Any

import pytest

from tests.support import novagen

ROOT = Path(__file__).resolve().parent.parent


def test_the_ceiling_writes_under_the_writer_process_collector_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # the benchmarks import ``bench.*``
    ceiling = importlib.import_module("bench.ceiling")
    measure = importlib.import_module("bench.measure")
    bodies = [novagen.body(novagen.notification(seed=seed)) for seed in range(5)]
    automatic: list[bool] = []
    written: list[str] = []

    def write(ops: list[Any]) -> list[Any]:
        automatic.append(gc.isenabled())
        written.extend(op.id for op in ops)
        return ops

    tally = measure.Tally()
    assert gc.isenabled()
    done = ceiling.ceiling_chunk(write, bodies, 2, tally, count=len)
    assert gc.isenabled()  # restored for the phases that follow
    assert automatic == [False, False, False]  # batches of 2, 2 and 1
    assert done == 5 and len(set(written)) == 5
    assert tally.summary("docs")["docs"] == 5
