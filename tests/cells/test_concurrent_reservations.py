"""Reservations, their moves between hosts, live migrations, node state changes and boots
with deletes, several at once in one cell, on every dialect.

Each of these claims on some nodes and releases on others: a move from h1 to h2 locks
h1's node then h2's, one from h2 to h1 the other way round, and InnoDB also deadlocks
two transactions that reach one node's row through two indexes. Nodes are locked one
way only (``cellsight.cells.node_locks``), so no transaction here is a deadlock's victim:
none is run again (``retry_conflicts`` logs each), none fails, and the nodes' counts add
up to the rows. A retry logged here is a new path that locks nodes another way."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cellsight.cells.instances import BootRequest
from cellsight.cells.nodeevents import register_node, set_node_state
from cellsight.cells.reservations import Reservations
from tests.cells.test_reservations_races import Cell
from tests.support.services import DIALECTS, DatabaseFactory
from tests.support.together import run_together

ROUNDS = 10
BIG = {"vcpus": 512, "memory_mb": 1 << 20, "local_gb": 100_000, "cpu_allocation_ratio": 1.0}


@pytest.fixture(params=DIALECTS)
def cell(
    request: pytest.FixtureRequest, make_database: DatabaseFactory, tmp_path: Path
) -> Iterator[Cell]:
    made = Cell(make_database, request.param, tmp_path, hosts=("h1", "h2", "h3"), node=BIG)
    for node in ("h4a", "h4b"):  # a host with two nodes
        register_node(made.ops, "cell1", "h4", hypervisor_hostname=node, **BIG)
    yield made
    made.registry.close()


@pytest.mark.services
def test_concurrent_claims_and_releases_never_deadlock(
    cell: Cell, caplog: pytest.LogCaptureFixture
) -> None:
    kept: list[str] = []
    ops = cell.ops

    def reserver(n: int) -> None:
        reservations = Reservations(ops)
        hosts = ("h1", "h2") if n % 2 else ("h2", "h1")
        for k in range(ROUNDS):
            made = reservations.reserve(flavor="m1.tiny", host=hosts[0], name=f"r{n}-{k}")
            reservations.modify(made.uuid, host=hosts[1], project_id="p", user_id="u")
            if k % 3 == 0:
                reservations.cancel(made.uuid)
            elif k % 3 == 1:
                reservations.commit(made.uuid)
                ops.delete(made.uuid)
            else:
                kept.append(made.uuid)
            booted = ops.boot(BootRequest(f"vm{n}-{k}", "m1.tiny", "p", "u", count=2))
            for p in booted.instances:
                ops.delete(p.uuid)

    def migrator(n: int) -> None:
        for k in range(ROUNDS):
            (booted,) = ops.boot(BootRequest(f"lm{n}-{k}", "m1.tiny", "p", "u")).instances
            here, order = booted.host, ("h1", "h2", "h3") if n % 2 else ("h3", "h2", "h1")
            for _ in range(2):  # two migrations, the two threads' in opposite orders
                here = next(host for host in order if host != here)
                ops.live_migrate(booted.uuid, host=here)
            ops.delete(booted.uuid)

    def noder(n: int) -> None:
        reservations = Reservations(ops)
        for k in range(ROUNDS * 2):
            set_node_state(ops, "cell1", "h4" if k % 2 else "h1", offline=False)
            made = reservations.reserve(flavor="m1.tiny", host="h4", name=f"q{n}-{k}")
            reservations.modify(made.uuid, host="h1")
            reservations.cancel(made.uuid)

    failures, retried = run_together([reserver, reserver, migrator, migrator, noder, noder], caplog)
    assert failures == []
    assert retried == []
    said, summed = cell.usage()
    assert said == summed
    assert sum(reserved for _, reserved in said.values()) == len(kept) == 2 * (ROUNDS // 3)
