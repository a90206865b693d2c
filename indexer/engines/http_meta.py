"""The metadata store on the HTTP engines, and the sync lock's compare-and-set.

Metadata documents live behind the ``<prefix>-meta`` alias and are written with
``require_alias`` so that a missing meta index is created with its strict mapping
instead of being auto-created dynamic.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from cellsight.indexer.engines.base import (
    EngineConflict,
    EngineRejected,
    EngineUnavailable,
    IndexMissing,
)
from cellsight.indexer.engines.http_core import HttpCore
from cellsight.indexer.engines.http_documents import doc_path

_META_MAPPING: dict[str, Any] = {
    "dynamic": "strict",
    "properties": {
        "value": {"type": "object", "enabled": False},
        "updated_at": {"type": "date"},
    },
}
# Rounds of compare-and-set before giving up while racers create the meta index.
_SWAP_ATTEMPTS = 20


class HttpMeta(HttpCore):
    def get_meta(self, key: str) -> dict[str, Any] | None:
        try:
            body = self._send("GET", doc_path(self.meta_alias(), key))
        except IndexMissing:  # no such key, or no meta index yet
            return None
        # A body of another shape is no record (a proxy's answer that still parses).
        source = body.get("_source") if isinstance(body, dict) else None
        value = source.get("value") if isinstance(source, dict) else None
        return dict(value) if isinstance(value, dict) else None

    def put_meta(self, key: str, value: dict[str, Any]) -> None:
        path = doc_path(self.meta_alias(), key)
        doc = {"value": value, "updated_at": datetime.now(UTC).isoformat()}
        params = {"require_alias": "true"}
        try:
            self._send("PUT", path, params=params, body=doc)
            return
        except IndexMissing:
            pass
        self._create_meta_index()
        self._send("PUT", path, params=params, body=doc)

    def _create_meta_index(self) -> None:
        name = f"{self.meta_alias()}-{datetime.now(UTC):%Y%m%d%H%M%S%f}"
        body = {
            "settings": {"index": {"number_of_shards": 1}},
            "mappings": _META_MAPPING,
            "aliases": {self.meta_alias(): {}},
        }
        self._send("PUT", f"/{name}", body=body)
        dates = self._creation_dates(self.meta_alias())
        if len(dates) > 1:  # a concurrent writer created one too: keep the oldest
            oldest = min(dates, key=lambda n: (dates[n], n))
            if name != oldest:
                self.drop_index(name)

    def swap_meta(self, key: str, expected: dict[str, Any] | None, value: dict[str, Any]) -> bool:
        path = doc_path(self.meta_alias(), key)
        doc = {"value": value, "updated_at": datetime.now(UTC).isoformat()}
        refused: EngineRejected | None = None
        for _attempt in range(_SWAP_ATTEMPTS):
            try:
                current: dict[str, Any] | None = self._send("GET", path)
            except EngineRejected as exc:
                # Racers creating the meta index at once: for a moment the alias spans
                # two and reads and writes through it are refused (400) until all but
                # the oldest are dropped. Try again; refused every time: raised below.
                refused = exc
                time.sleep(0.05)
                continue
            except IndexMissing:  # no such key, or no meta index yet
                current = None
            found = bool(current and current.get("found"))
            stored = (current or {}).get("_source", {}).get("value") if found else None
            if stored != expected:
                return False
            # Optimistic concurrency: the write fails (409) if anyone wrote in between.
            params = {"require_alias": "true"}
            if found and current is not None:
                params["if_seq_no"] = str(current["_seq_no"])
                params["if_primary_term"] = str(current["_primary_term"])
            else:
                params["op_type"] = "create"
            try:
                self._send("PUT", path, params=params, body=doc)
                return True
            except EngineConflict:
                return False
            except IndexMissing:
                if found:
                    raise
                self._create_meta_index()  # then compare again from the start
            except EngineRejected as exc:
                refused = exc  # as above
                time.sleep(0.05)
        if refused is not None:
            raise refused
        raise EngineUnavailable(f"{self.distribution}: could not settle meta key {key!r}")
