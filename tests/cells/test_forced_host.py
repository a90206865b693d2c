"""A reservation on a named host, on every dialect. The ``Selection`` it returns names
the node it claimed, also on a host with several nodes (Ironic's), whose rows a
database may return in any order (PostgreSQL after ``ANALYZE``, once claims have
rewritten the rows: a sequential scan returned the other node, found by a review)."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest
import sqlalchemy as sa

from cellsight.cells.errors import NoValidHost
from cellsight.cells.mappings import CellMapping, CellRegistry
from cellsight.cells.nodeevents import NODE_UPDATE
from cellsight.cells.nodes import add_compute_node
from cellsight.cells.operations import Operations
from cellsight.cells.reads import get_instance
from cellsight.cells.reservations import MODIFY, Reservations
from cellsight.cells.schema import compute_nodes
from cellsight.notifications.objects import ComputeNodePayload
from tests.support.publishers import CollectingPublisher


def test_the_selection_names_the_claimed_node(
    registry: CellRegistry, add_cell: Callable[..., CellMapping], ops: Operations
) -> None:
    cell = add_cell("multi", hosts=())
    engine = registry.cell_engine(cell)
    for node in ("n-a", "n-b"):
        add_compute_node(engine, "h1", hypervisor_hostname=node)
    res = Reservations(ops)
    for attempt in range(4):
        made = res.reserve(flavor="m1.small", host="h1")
        if attempt == 0 and engine.dialect.name == "postgresql":
            with engine.connect() as conn:  # the planner then scans the rewritten rows
                conn.execute(sa.text("ANALYZE compute_nodes"))
                conn.commit()
        with engine.connect() as conn:
            stored = get_instance(conn, made.uuid)
            used = dict(
                conn.execute(
                    sa.select(compute_nodes.c.hypervisor_hostname, compute_nodes.c.vcpus_used)
                ).all()
            )
        assert stored is not None
        (selection,) = made.selections
        assert (selection.service_host, selection.nodename) == ("h1", stored["node"])
        # Every claim went to the node the reservations name.
        assert used[stored["node"]] == attempt + 1 and sum(used.values()) == attempt + 1


def test_a_modify_to_a_host_the_database_compares_equal_is_announced(
    registry: CellRegistry,
    add_cell: Callable[..., CellMapping],
    ops: Operations,
    publisher: CollectingPublisher,
) -> None:
    """MariaDB compares 'h1 ' equal to 'h1' (PAD SPACE): the modify moves the claim off
    the node and back, writing the node's row; that is announced as any move, not taken
    for a no-op (found by a review: the node's document was left a revision behind)."""
    cell = add_cell("multi", hosts=("h1",))
    res = Reservations(ops)
    made = res.reserve(flavor="m1.small", host="h1")
    publisher.take()
    engine = registry.cell_engine(cell)
    if engine.dialect.name not in ("mysql", "mariadb"):
        with pytest.raises(NoValidHost):  # another host, which the cell does not have
            res.modify(made.uuid, host="h1 ")
        assert publisher.take() == []
        return
    res.modify(made.uuid, host="h1 ")
    sent = publisher.take()
    with engine.connect() as conn:
        (revision,) = conn.execute(
            sa.select(compute_nodes.c.revision).where(compute_nodes.c.host == "h1")
        ).one()
    assert [n.event_type for n in sent if n.event_type != NODE_UPDATE] == [MODIFY]
    assert [
        cast(ComputeNodePayload, n.payload).revision for n in sent if n.event_type == NODE_UPDATE
    ] == [revision]
