"""Row locks on compute nodes, taken one way only: by primary key, in id order.

InnoDB locks a row through the index a statement finds it by: ``UPDATE … WHERE uuid = ?``
locks the uuid index's entry and then the row, ``SELECT … WHERE id IN (…) FOR UPDATE``
the row alone. Two transactions reaching one node's row by two paths deadlock on that
one row (seen on MariaDB: a reservation's claim by uuid against a boot's ordered lock,
84 deadlocks in about 310 transactions with six threads at once). So every statement
that locks a node finds its ids first, without locking (a consistent read), and locks by
primary key only; several rows in id order, so that two transactions wanting the same
nodes queue instead of each holding one. SQLite's write lock already serialises writers.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

from cellsight.cells.schema import compute_nodes


def node_ids(conn: sa.Connection, *where: sa.ColumnElement[bool]) -> list[int]:
    """The ids of the nodes that match, in id order, read without locking them."""
    c = compute_nodes.c
    return [int(i) for i in conn.execute(sa.select(c.id).where(*where).order_by(c.id)).scalars()]


def lock_ids(conn: sa.Connection, ids: Iterable[int]) -> None:
    """Lock these nodes in id order. One alone needs no order: the statement that changes
    it, by primary key, locks it."""
    ordered = sorted(set(ids))
    if len(ordered) > 1 and conn.dialect.name != "sqlite":
        c = compute_nodes.c
        conn.execute(sa.select(c.id).where(c.id.in_(ordered)).order_by(c.id).with_for_update())


def locked_ids(conn: sa.Connection, *where: sa.ColumnElement[bool]) -> list[int]:
    """``node_ids``, locked in id order (an UPDATE of several locks in its scan order,
    PostgreSQL's not id order)."""
    ids = node_ids(conn, *where)
    lock_ids(conn, ids)
    return ids


def lock_nodes(conn: sa.Connection, node_uuids: Iterable[str]) -> None:
    """Lock these nodes before claims that would take them in the order of a request's
    choices: two boots then wait for each other instead of holding a host each."""
    wanted = sorted(set(node_uuids))
    if len(wanted) > 1:
        locked_ids(conn, compute_nodes.c.uuid.in_(wanted))


def lock_hosts(conn: sa.Connection, hosts: Iterable[str | None]) -> None:
    """``lock_nodes`` for every node of these hosts, before a change that releases on some
    and claims on others (a reservation's modify, a move to make room)."""
    wanted = sorted({host for host in hosts if host})
    if wanted:
        locked_ids(conn, compute_nodes.c.host.in_(wanted))
