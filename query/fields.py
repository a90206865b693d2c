"""What the filter language knows of a field: its name, kind, and whether it has many values.

The registry of a resource's fields (``{name: DocField}``) is derived elsewhere, from
the payload objects (``cellsight.indexer.fields``); every compiler here takes it as an argument,
so the language depends on no resource's definition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    KEYWORD = "keyword"
    TEXT = "text"  # full text with a keyword sub-field, for names
    LONG = "long"
    DOUBLE = "double"
    BOOLEAN = "boolean"
    DATE = "date"
    IP = "ip"
    OBJECT = "object"  # stored and returned, never searched


@dataclass(frozen=True)
class DocField:
    name: str
    kind: Kind
    many: bool = False
    doc: str = ""
    # Every document has a value (``cellsight.indexer.fields.NEVER_NULL``): a query may
    # rely on it, e.g. the keyset's range bound on the first sort key (``tree.after``).
    never_null: bool = False

    @property
    def sortable(self) -> bool:
        return self.kind is not Kind.OBJECT and not self.many


# A resource's fields by name, as the compilers take them.
Fields = Mapping[str, DocField]
