"""The query2 field registry: Ganeti's naming rules over every field, derived not listed."""

from __future__ import annotations

import re

import pytest

from cellsight.api.query2.fields import (
    COMPUTED,
    DOCS,
    HIDDEN,
    REGISTRY,
    RENAMES,
    QKind,
    definitions,
)
from cellsight.indexer.fields import FIELDS_BY_RESOURCE, Kind

NAME = re.compile(r"[a-z0-9/._]+")
KINDS = {"unknown", "text", "bool", "number", "unit", "timestamp", "other"}


def _all_definitions() -> list[tuple[str, dict[str, str]]]:
    return [(resource, d) for resource in REGISTRY for d in definitions(resource)]


@pytest.mark.parametrize(("resource", "definition"), _all_definitions(), ids=lambda v: str(v))
def test_every_definition_follows_ganeti_rules(resource: str, definition: dict[str, str]) -> None:
    assert set(definition) == {"name", "title", "kind", "doc"}
    assert NAME.fullmatch(definition["name"]), definition
    title = definition["title"]
    assert title and not re.search(r"\s", title), definition
    doc = definition["doc"]
    assert doc and doc[0].isupper(), definition
    assert doc[-1].isalnum(), f"doc ends with punctuation: {definition}"
    assert definition["kind"] in KINDS - {"unknown"}, definition


def test_registry_is_derived_from_the_document_fields() -> None:
    for resource, fields in FIELDS_BY_RESOURCE.items():
        expected = {RENAMES[resource].get(f.name, f.name) for f in fields if f.name not in HIDDEN}
        expected |= {f.name for f in COMPUTED[resource]}
        assert set(REGISTRY[resource]) == expected
        for field in REGISTRY[resource].values():
            if field.name in {f.name for f in COMPUTED[resource]}:
                continue  # computed when rendered, or added to each node snapshot
            source = next(f for f in fields if f.name == field.doc_field)
            assert field.doc_kind is source.kind and field.many == source.many


def test_docs_name_only_real_fields() -> None:
    # A doc for a field that no longer exists would hide a rename.
    for resource, docs in DOCS.items():
        assert set(docs) <= set(REGISTRY[resource]), set(docs) - set(REGISTRY[resource])


def test_kinds_map_from_document_kinds() -> None:
    inst, node = REGISTRY["instance"], REGISTRY["node"]
    assert inst["name"].doc_field == "display_name" and inst["name"].kind is QKind.TEXT
    assert inst["created_at"].kind is QKind.TIMESTAMP
    assert inst["locked"].kind is QKind.BOOL
    assert inst["progress"].kind is QKind.NUMBER
    assert inst["flavor_rxtx_factor"].kind is QKind.NUMBER
    assert inst["tags"].kind is QKind.OTHER and inst["tags"].many
    assert inst["metadata"].kind is QKind.OTHER and not inst["metadata"].filterable
    for size in ("flavor_memory_mb", "flavor_root_gb", "flavor_ephemeral_gb", "flavor_swap"):
        assert inst[size].kind is QKind.UNIT, size
    for size in ("memory_mb", "memory_mb_used", "local_gb", "local_gb_used"):
        assert node[size].kind is QKind.UNIT, size
    assert node["vcpus"].kind is QKind.NUMBER
    assert all(f.name not in ("version", "event_type", "indexed_at") for f in inst.values())
    assert all(f.doc_kind is not Kind.OBJECT or not f.filterable for f in inst.values())


def test_status_is_the_one_computed_field() -> None:
    status = REGISTRY["instance"]["status"]
    assert status.computed and status.kind is QKind.TEXT and status.filterable
    assert [f for f in REGISTRY["instance"].values() if f.computed] == [status]
    assert not any(f.computed for f in REGISTRY["node"].values())


def test_definitions_of_named_fields_keep_order_and_mark_unknown() -> None:
    got = definitions("instance", ["uuid", "no_such", "name"])
    assert [d["name"] for d in got] == ["uuid", "no_such", "name"]
    assert got[1] == {
        "name": "no_such",
        "title": "no_such",
        "kind": "unknown",
        "doc": "Unknown field",
    }
    assert got[0]["kind"] == "text"
