"""Boots that move reservations to make room, several at once with reservations being
made and cancelled in the same cell, on every dialect.

A boot that makes room locks the reservations it planned to move, then every node the
moves and the boot touch (``cellsight.cells.room``), in the order every other operation
takes them: rows, then nodes in id order. So none of these transactions is a deadlock's
victim, the nodes' counts add up to the rows, and boots that needed moves land."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellsight.cells.errors import NoValidHost
from cellsight.cells.instances import BootRequest
from cellsight.cells.reservations import MOVE, Reservations
from tests.cells.test_reservations_races import NODE, Cell
from tests.support.publishers import CollectingPublisher
from tests.support.services import DIALECTS, DatabaseFactory
from tests.support.together import run_together

ROUNDS = 8
HOSTS = ("h1", "h2", "h3", "h4", "h5")


@pytest.fixture(params=DIALECTS)
def cell(
    request: pytest.FixtureRequest, make_database: DatabaseFactory, tmp_path: Path
) -> Iterator[Cell]:
    made = Cell(make_database, request.param, tmp_path, hosts=HOSTS, node=NODE)
    for host in HOSTS[:4]:  # 2 of each host's 4 VCPUs held: a 4-VCPU boot needs a move
        made.reservations.reserve(flavor="m1.medium", host=host)
    yield made
    made.registry.close()


@pytest.mark.services
def test_boots_making_room_beside_reservations_never_deadlock(
    cell: Cell, caplog: pytest.LogCaptureFixture
) -> None:
    booted: list[str] = []
    refused: list[NoValidHost] = []
    ops = cell.ops
    publisher = ops.publisher
    assert isinstance(publisher, CollectingPublisher)
    publisher.take()

    def booter(n: int) -> None:
        reservations = Reservations(ops)
        held: list[str] = []
        for k in range(ROUNDS):
            try:
                (made,) = ops.boot(BootRequest(f"big{n}-{k}", "m1.large", "p", "u")).instances
            except NoValidHost as exc:  # the churn can hold what a move needed
                refused.append(exc)
                continue
            booted.append(made.uuid)
            ops.delete(made.uuid)
            # Its host is free again: hold half of it (and let go of the last such hold),
            # so that the next boot needs room again and the cell never fills up.
            with contextlib.suppress(NoValidHost):  # another boot's moves took it meanwhile
                held.append(reservations.reserve(flavor="m1.medium", host=made.host).uuid)
            while len(held) > 1:
                reservations.cancel(held.pop(0))

    def churner(n: int) -> None:
        reservations = Reservations(ops)
        for k in range(ROUNDS * 2):
            try:
                made = reservations.reserve(flavor="m1.tiny", name=f"t{n}-{k}")
            except NoValidHost:  # the boots can fill the cell for a moment
                continue
            with contextlib.suppress(NoValidHost):
                reservations.modify(made.uuid, host=HOSTS[(n + k) % len(HOSTS)])
            reservations.cancel(made.uuid)

    failures, retried = run_together([booter, booter, churner, churner], caplog)
    assert failures == []
    assert retried == []
    said, summed = cell.usage()
    assert said == summed
    moves = [n for n in publisher.take() if n.event_type == MOVE]
    assert booted and moves  # boots landed, and reservations moved to make room for them
    assert len(booted) + len(refused) == 2 * ROUNDS
