"""The embedded index's table layout, generated from the field registry.

A concrete index is three tables (``#`` cannot appear in an index name, so none collide):

* ``"<index>"``: ``rid`` (integer primary key), ``id`` (unique), ``version`` (the external
  version), and one column per sortable field, named exactly like the field. It is kept
  narrow (~300 bytes a row) so unindexed filters, counts and index builds scan little.
* ``"<index>#doc"(rid, doc)``: the whole document as JSON, which is what reads return.
  ``rid`` is assigned by the writer (max + 1, under the write lock), so both tables are
  appended to in rowid order.
* ``"<index>#many"(rid, field, value)``: multi-valued keyword fields (tags, ip4, ip6),
  keyed by ``(rid, field, value)`` so replacing a document's values is a prefix delete,
  plus a ``(field, value)`` index (covering: it carries the key) for "has tag X".

Dates are stored as integer microseconds since the epoch (UTC). The wire form drops a
zero fraction (``...11Z`` vs ``...11.5Z``), so the strings do not sort as text; integers
sort, compare and index exactly and fit every timestamp Python can represent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from cellsight.indexer.fields import FIELDS_BY_RESOURCE, DocField, Kind
from cellsight.notifications.base import format_timestamp

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1

# Elasticsearch's index name rules, narrowed: lowercase, no quotes, no '#'.
_INDEX_NAME = re.compile(r"[a-z0-9][a-z0-9_.+-]{0,199}")

COLUMN_ORDER = (Kind.KEYWORD, Kind.TEXT, Kind.IP, Kind.LONG, Kind.BOOLEAN, Kind.DOUBLE, Kind.DATE)
AFFINITY = {
    Kind.KEYWORD: "TEXT",
    Kind.TEXT: "TEXT",
    Kind.IP: "TEXT",
    Kind.DATE: "INTEGER",
    Kind.LONG: "INTEGER",
    Kind.BOOLEAN: "INTEGER",
    Kind.DOUBLE: "REAL",
}

# Secondary indexes, built after a bulk load. Chosen for the Nova list API: its default
# order (created_at), project scoping, changes-since (updated_at), the common exact
# filters, and the per-cell count and version scan. Every extra index slows live writes.
#
# A filter on a column of few values (``state``: three quarters of the instances are
# active) needs its index to carry the default order too: SQLite's planner does not count
# on a LIMIT ending an ordered index walk early, so given ``state = ? ORDER BY created_at
# LIMIT n`` and a plain ``(state)`` index it reads every matching row and sorts them
# (seconds at a million instances); with ``(state, created_at)`` it walks that state's
# rows newest first and stops after n, and a rare state still costs only its own rows.
#
# What an index costs a live write is the pages a batch dirties, which the commit writes
# to the WAL and the checkpoint copies back. New instances come in creation order with
# random uuids: an index ordered by uuid within a few groups takes each batch's entries
# all over itself, one dirty page per entry once it is large, where one ordered by time
# or by ``rid`` (the insertion order) takes them at a few ends. So the per-cell index is
# ``(cell_uuid, rid)``, carrying ``id`` and ``version`` for the scan without being ordered
# by them (the scan sorts, ``sqlite_scans``), and no index carries ``id`` as a tie
# breaker: the sort's tie breaker is the ``uuid`` column, which SQLite cannot know is
# ``id``, so the suffix only made the entries larger. Measured with new instances into an
# empty index in batches of 1,000 (``scripts/bench_embedded.py``, the layout before this
# one against this one): 17,425 -> 22,399 docs/s over 100,000 and 8,546 -> 12,168 over a
# million; each index alone: ``scripts/bench_index_costs.py``.
CELL_SCAN = ("cell_uuid", "rid", "id", "version")
INDEXED_COLUMNS: dict[str, list[tuple[str, ...]]] = {
    "instance": [
        CELL_SCAN,
        ("created_at",),
        ("tenant_id", "created_at"),
        ("updated_at",),
        ("user_id",),
        ("host",),
        ("node",),
        ("state", "created_at"),
        ("display_name",),
    ],
    "node": [CELL_SCAN, ("host",), ("hypervisor_hostname",), ("updated_at",)],
}


def quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def check_index_name(name: str) -> str:
    if not _INDEX_NAME.fullmatch(name):
        raise ValueError(f"index name {name!r}: use lowercase letters, digits and _ . + -")
    return name


def index_name(index: str, columns: Sequence[str]) -> str:
    """The name of the secondary index of ``index`` on ``columns`` (unquoted)."""
    return f"{index}#{'_'.join(columns)}"


def order_index(resource: str, index: str, field: str) -> str | None:
    """The secondary index of ``index`` that leads with ``field`` (its rows in that
    field's order), if ``INDEXED_COLUMNS`` has one."""
    for columns in INDEXED_COLUMNS.get(resource, []):
        if columns[0] == field:
            return index_name(index, columns)
    return None


def cell_scan_index(index: str) -> str:
    """The secondary index of ``index`` that holds each cell's ids and versions."""
    return index_name(index, CELL_SCAN)


def doc_table(index: str) -> str:
    return quote(f"{index}#doc")


def side_table(index: str) -> str:
    return quote(f"{index}#many")


def date_to_micros(value: str) -> int:
    """An ISO 8601 timestamp (``Z``, an offset, or none meaning UTC) as epoch µs."""
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return (parsed - _EPOCH) // _MICROSECOND


def micros_to_date(value: int) -> str:
    """Back to the wire form, for values read from a date column."""
    return format_timestamp(_EPOCH + timedelta(microseconds=value))


class Schema:
    """The columns and SQL of one resource's tables."""

    def __init__(self, resource: str, fields: Sequence[DocField]) -> None:
        self.resource = resource
        self.fields = {f.name: f for f in fields}
        # "version" is a document field and the external version: the column holds the
        # op's version so the update's guard and a sort on "version" agree. Columns are
        # grouped by kind, so a row's values of one kind are one slice to type-check.
        scalar = [f for f in fields if f.sortable and f.name != "version"]
        self.columns = sorted(scalar, key=lambda f: COLUMN_ORDER.index(f.kind))
        self.many_fields = [f for f in fields if f.many and f.kind is not Kind.OBJECT]
        self.object_fields = [f for f in fields if f.kind is Kind.OBJECT]
        self.row_names = ["id", "version", *(f.name for f in self.columns)]

    def row_slice(self, *kinds: Kind) -> slice:
        """Where the columns of ``kinds`` (adjacent in ``COLUMN_ORDER``) sit in a row."""
        at = [i for i, f in enumerate(self.columns, start=2) if f.kind in kinds]
        return slice(at[0], at[-1] + 1) if at else slice(0, 0)

    # SQL -------------------------------------------------------------------
    def column(self, field: str) -> str:
        """The SQL expression of a sortable/filterable field (search compiles to it)."""
        if field == "id" or (field in self.fields and self.fields[field].sortable):
            return quote(field)
        raise KeyError(f"{self.resource} field {field!r} has no column")

    def create_sql(self, index: str) -> list[str]:
        cols = "".join(f", {quote(f.name)} {AFFINITY[f.kind]}" for f in self.columns)
        return [
            f"CREATE TABLE {quote(index)} (rid INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, "
            f"version INTEGER NOT NULL{cols})",
            f"CREATE TABLE {doc_table(index)} (rid INTEGER PRIMARY KEY, doc TEXT NOT NULL)",
            f"CREATE TABLE {side_table(index)} (rid INTEGER NOT NULL, field TEXT NOT NULL, "
            "value TEXT NOT NULL, PRIMARY KEY (rid, field, value)) WITHOUT ROWID",
        ]

    def index_sql(self, index: str) -> list[str]:
        return list(self.secondary_indexes(index).values())

    def secondary_indexes(self, index: str) -> dict[str, str]:
        """Name -> ``CREATE INDEX`` of every secondary index of ``index``'s tables."""
        out = {}
        for cols in INDEXED_COLUMNS[self.resource]:
            name = index_name(index, cols)
            out[name] = (
                f"CREATE INDEX IF NOT EXISTS {quote(name)} "
                f"ON {quote(index)} ({', '.join(quote(c) for c in cols)})"
            )
        out[f"{index}#many_value"] = (
            f"CREATE INDEX IF NOT EXISTS {quote(index + '#many_value')} "
            f"ON {side_table(index)} (field, value)"
        )
        return out

    def insert_sql(self, index: str) -> str:
        names = ["rid", *self.row_names]
        marks = ", ".join("?" * len(names))
        return f"INSERT INTO {quote(index)} ({', '.join(quote(n) for n in names)}) VALUES ({marks})"


SCHEMAS: dict[str, Schema] = {r: Schema(r, fs) for r, fs in FIELDS_BY_RESOURCE.items()}
