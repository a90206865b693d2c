"""Reservations, their moves between hosts and boots with deletes, several at once in one
cell, on every dialect. A move from h1 to h2 locks h1's node then h2's, one from h2 to h1
the other way round, so PostgreSQL and MariaDB find them deadlocked: the victim's
transaction runs again (``retry_conflicts``) instead of failing as the database being
unavailable, and the nodes' counts still add up to the rows."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellsight.cells.instances import BootRequest
from cellsight.cells.reservations import Reservations
from tests.cells.test_reservations_races import Cell
from tests.support.services import DIALECTS, DatabaseFactory

THREADS, ROUNDS = 6, 12
BIG = {"vcpus": 512, "memory_mb": 1 << 20, "local_gb": 100_000, "cpu_allocation_ratio": 1.0}


@pytest.fixture(params=DIALECTS)
def cell(
    request: pytest.FixtureRequest, make_database: DatabaseFactory, tmp_path: Path
) -> Iterator[Cell]:
    made = Cell(make_database, request.param, tmp_path, hosts=("h1", "h2", "h3"), node=BIG)
    yield made
    made.registry.close()


@pytest.mark.services
def test_concurrent_reservations_moves_and_boots_all_land(cell: Cell) -> None:
    failures: list[BaseException] = []
    start = threading.Barrier(THREADS)
    kept: list[str] = []

    def work(n: int) -> None:
        reservations = Reservations(cell.ops)
        hosts = ("h1", "h2") if n % 2 else ("h2", "h1")
        start.wait()
        for k in range(ROUNDS):
            try:
                made = reservations.reserve(flavor="m1.tiny", host=hosts[0], name=f"r{n}-{k}")
                reservations.modify(made.uuid, host=hosts[1], project_id="p", user_id="u")
                if k % 3 == 0:
                    reservations.cancel(made.uuid)
                elif k % 3 == 1:
                    reservations.commit(made.uuid)
                    cell.ops.delete(made.uuid)
                else:
                    kept.append(made.uuid)
                booted = cell.ops.boot(BootRequest(f"vm{n}-{k}", "m1.tiny", "p", "u"))
                cell.ops.delete(booted.instances[0].uuid)
            except BaseException as exc:  # surfaced below
                failures.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    said, summed = cell.usage()
    assert said == summed
    assert sum(reserved for _, reserved in said.values()) == len(kept) == THREADS * ROUNDS // 3
