"""JSON Schema export: one document per payload class and version.

Each document describes the wire form (``nova_object.*`` keys, nested objects in the
same shape) in JSON Schema draft 2020-12, the dialect pydantic generates. The
``nova_object.version`` pattern accepts every minor of the class's major version,
which is the compatibility rule readers apply.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cellsight.notifications.base import VersionedObject
from cellsight.notifications.registry import REGISTRY

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def schema_classes() -> list[type[VersionedObject]]:
    """Every payload class this code reads, ordered by namespace and name."""
    return sorted(set(REGISTRY.values()), key=lambda cls: (cls.OBJ_NAMESPACE, cls.OBJ_NAME))


def schema_filename(cls: type[VersionedObject]) -> str:
    return f"{cls.OBJ_NAME}-{cls.OBJ_VERSION}.json"


def payload_schema(cls: type[VersionedObject]) -> dict[str, Any]:
    """The JSON Schema of ``cls``'s wire form (validation mode: what a reader accepts)."""
    schema = cls.model_json_schema(mode="validation")
    return {"$schema": DIALECT, "$id": schema_filename(cls), **schema}


def write_schemas(out_dir: Path) -> list[Path]:
    """Write every payload schema into ``out_dir`` (created); return the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for cls in schema_classes():
        path = out_dir / schema_filename(cls)
        path.write_text(json.dumps(payload_schema(cls), indent=2, sort_keys=False) + "\n")
        written.append(path)
    return written
