"""Document fields → the cells' ``instances`` table, for the fan-out path.

A fan-out result is ``instance_document(row_to_payload(row))``, so every field resolves
to exactly what that conversion puts in the document:

* Renamed columns (``tenant_id`` ← ``project_id``, ``state`` ← ``vm_state``,
  ``host_name`` ← ``hostname``, ``image_uuid`` ← ``image_ref``, ``version`` ←
  ``revision``) and the flavor's copied columns; the flavor fields without a column
  (swap, rxtx_factor, vcpu_weight) are read from the ``flavor`` JSON.
* ``deleted`` is the document rule (``deleted_at`` set or state ``deleted``) or'ed with
  the row's ``deleted`` flag, which the cells only set together with both: the flag
  lets ``deleted = false`` use the cells' indexes. ``state`` is ``'deleted'`` for a
  deleted row, as the document says, whatever ``vm_state`` holds.
* ``cell_uuid`` is one value per cell database (``Const``).
* ``tags`` (a JSON array of strings) and ``ip4``/``ip6`` (addresses of the
  ``ip_addresses`` JSON objects, split as ``documents.split_ips`` does: non-empty
  address, v6 when its version is 6 or it has a colon) are "any element" subqueries:
  SQLite ``json_each``, PostgreSQL ``jsonb_array_elements_text``/``jsonb_to_recordset``,
  MariaDB ``JSON_TABLE`` (its columns declared utf8mb4, compared as binary).
* ``event_type`` and ``indexed_at`` record how the index was written; a cell has no
  such thing, so they cannot be searched on this path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import TableClause

from cellsight.cells.schema import instances
from cellsight.query.fields import DocField, Kind
from cellsight.query.prepare import QueryError
from cellsight.query.sql import MYSQL_DIALECTS, Column, Condition, Const, Expr, Many, Resolved

RENAMED = {
    "tenant_id": "project_id",
    "host_name": "hostname",
    "image_uuid": "image_ref",
    "version": "revision",
    "flavor_flavorid": "flavor_id",
    "flavor_memory_mb": "memory_mb",
    "flavor_vcpus": "vcpus",
    "flavor_root_gb": "root_gb",
    "flavor_ephemeral_gb": "ephemeral_gb",
}
FLAVOR_JSON = {
    "flavor_swap": "swap",
    "flavor_rxtx_factor": "rxtx_factor",
    "flavor_vcpu_weight": "vcpu_weight",
}
INDEX_ONLY = frozenset({"event_type", "indexed_at"})


class JsonTable(TableClause):
    """MariaDB/MySQL ``JSON_TABLE(source, path COLUMNS (...)) AS name``; its columns are
    referenced as ``name.column`` like any table's."""

    inherit_cache = False

    def __init__(self, name: str, source: Expr, path: str, spec: str, *columns: str) -> None:
        super().__init__(name, *(sa.column(c, sa.String()) for c in columns))
        self.source, self.path, self.spec = source, path, spec


@compiles(JsonTable)
def _json_table(element: JsonTable, compiler: SQLCompiler, **kw: Any) -> str:
    if not kw.get("asfrom"):
        return compiler.preparer.quote(element.name)
    source = compiler.process(element.source)
    return f"JSON_TABLE({source}, '{element.path}' COLUMNS ({element.spec})) AS {element.name}"


def _exists(from_: Any, where: Condition) -> Condition:
    return sa.exists().select_from(from_).where(where)


class CellColumns:
    """The ``Resolver`` of one cell database's ``instances`` table."""

    def __init__(self, dialect: str, cell_uuid: str | None = None) -> None:
        self.dialect = "mariadb" if dialect in MYSQL_DIALECTS else dialect
        self.cell_uuid = cell_uuid
        c = instances.c
        vm_deleted = sa.and_(c.vm_state.is_not(None), c.vm_state == "deleted")
        self.deleted: Expr = sa.or_(c.deleted, vm_deleted, c.deleted_at.is_not(None))
        self.state: Expr = sa.case((self.deleted, "deleted"), else_=c.vm_state)

    def resolve(self, field: DocField) -> Resolved:
        name, c = field.name, instances.c
        if name in INDEX_ONLY:
            raise QueryError(f"field {name!r} is only known to the index, not to the cells")
        if name == "cell_uuid":
            return Const(self.cell_uuid)
        if name == "deleted":
            return Column(self.deleted, Kind.BOOLEAN, nullable=False)
        if name == "state":
            return Column(self.state, Kind.KEYWORD)
        if name == "tags":
            return Many(self._tags, Kind.KEYWORD)
        if name in ("ip4", "ip6"):
            return Many(self._addresses(v6=name == "ip6"), Kind.KEYWORD)
        if name in FLAVOR_JSON:
            return Column(self._flavor(FLAVOR_JSON[name], field.kind), field.kind)
        column = c.get(RENAMED.get(name, name))
        if column is None or field.kind is Kind.OBJECT or field.many:
            raise QueryError(f"field {name!r} cannot be searched in the cells")
        # uuids are validated UUID strings: nothing trails them (see Column.pad_safe)
        pad_safe = name == "uuid"
        return Column(column, field.kind, nullable=bool(column.nullable), pad_safe=pad_safe)

    def _flavor(self, key: str, kind: Kind) -> Expr:
        value = instances.c.flavor[key]
        if kind is Kind.DOUBLE:
            return value.as_float()
        if self.dialect == "postgresql":
            # as_integer() casts to INTEGER, which a 64-bit filter value would overflow
            return sa.cast(value.as_string(), sa.BigInteger())
        return value.as_integer()

    def _tags(self, predicate: Callable[[Expr], Condition]) -> Condition:
        source = instances.c.tags
        if self.dialect == "sqlite":
            each = sa.func.json_each(source).table_valued("value", name="e")
            return _exists(each, predicate(each.c.value))
        if self.dialect == "postgresql":
            elements = sa.func.jsonb_array_elements_text(source).table_valued("value", name="e")
            derived = elements.render_derived()
            return _exists(derived, predicate(derived.c.value))
        spec = "value VARCHAR(4096) CHARACTER SET utf8mb4 PATH '$'"
        table = JsonTable("e", source, "$[*]", spec, "value")
        return _exists(table, predicate(table.c.value))

    def _addresses(self, *, v6: bool) -> Callable[[Callable[[Expr], Condition]], Condition]:
        source = instances.c.ip_addresses

        def any_address(predicate: Callable[[Expr], Condition]) -> Condition:
            from_: Any
            if self.dialect == "sqlite":
                from_ = sa.func.json_each(source).table_valued("value", name="e")
                address = sa.func.json_extract(from_.c.value, "$.address", type_=sa.String())
                version = sa.func.json_extract(from_.c.value, "$.version", type_=sa.Integer())
            elif self.dialect == "postgresql":
                from_ = (
                    sa.func.jsonb_to_recordset(source)
                    .table_valued(
                        sa.column("address", sa.Text()),
                        sa.column("version", sa.Integer()),
                        name="e",
                    )
                    .render_derived(with_types=True)
                )
                address, version = from_.c.address, from_.c.version
            else:
                spec = (
                    "address VARCHAR(255) CHARACTER SET utf8mb4 PATH '$.address', "
                    "version INT PATH '$.version'"
                )
                from_ = JsonTable("e", source, "$[*]", spec, "address", "version")
                address, version = from_.c.address, from_.c.version
            is_v6 = sa.or_(
                sa.and_(version.is_not(None), version == 6),
                address.contains(":", autoescape=True),
            )
            present = sa.and_(address.is_not(None), sa.func.length(address) > 0)
            family = is_v6 if v6 else sa.not_(is_v6)
            return _exists(from_, sa.and_(present, family, predicate(address)))

        return any_address
