"""Index administration on the HTTP engines: concrete indexes and their aliases.

Concrete indexes are named ``<prefix>-<resource>-<UTC timestamp>`` and carry
``_meta.cellsight`` in their mapping (prefix, resource, creation time, and the replica
count to restore after a bulk load), which is also how ``indexes()`` recognises them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from cellsight.indexer.engines.base import EngineError, IndexInfo, IndexMissing
from cellsight.indexer.engines.http_core import META_KEY, HttpCore
from cellsight.indexer.fields import search_mapping

log = logging.getLogger(__name__)


class HttpAdmin(HttpCore):
    def ensure_ready(self, resource: str) -> None:
        read, write = self.read_alias(resource), self.write_alias(resource)
        current = self._aliases_of(resource)
        readers = sorted(name for name, aliases in current.items() if read in aliases)
        writers = sorted(name for name, aliases in current.items() if write in aliases)
        if readers or writers:
            # half set up (an interrupted sync, a hand edit): complete it in place
            if not writers:
                self.set_aliases(resource, read=readers[0], write=readers[:1])
            elif not readers:
                self.set_aliases(resource, read=self._newest_write_index(resource), write=writers)
            self._add_missing_fields(resource)
            return
        name = self.new_index_name(resource)
        body = self._index_body(resource, bulk_load=False)
        body["aliases"] = {read: {}, write: {}}
        self._send("PUT", f"/{name}", body=body)
        # Two processes starting together can each create an index; the aliases then
        # span both. Every racer sees the same creation order, so all but the oldest
        # index step back and exactly one serves. The others are left unaliased, not
        # dropped: a bulk under way to one (it resolved the write alias meanwhile) made
        # the cluster create it again, dynamic and unaliased. The next sync's or
        # verify's clean-up drops them (``index_roles.clean_up``: strays).
        dates = self._creation_dates(read)
        oldest = min(dates, key=lambda n: (dates[n], n))
        if name != oldest:
            actions = [{"remove": {"index": name, "alias": alias}} for alias in (read, write)]
            self._send("POST", "/_aliases", body={"actions": actions})
            log.warning("left %s unaliased: %s was made first", name, oldest)

    def _add_missing_fields(self, resource: str) -> None:
        """Fields added to the registry since an index behind the write alias was made
        (its mapping is strict, so documents holding them would be refused). Adding a
        field to a mapping is allowed on a live index; documents already stored lack
        it until they are rewritten, which every reader allows for."""
        wanted = search_mapping(resource)["properties"]
        body = self._send("GET", f"/{self.write_alias(resource)}/_mapping")
        for name, info in sorted(body.items()):
            have = info.get("mappings", {}).get("properties", {})
            missing = {field: m for field, m in wanted.items() if field not in have}
            if missing:
                self._send("PUT", f"/{name}/_mapping", body={"properties": missing})
                log.warning("index %s: added fields %s", name, ", ".join(sorted(missing)))

    def _live_replicas(self, resource: str) -> int | None:
        """The explicit replica count of the index behind the read alias, if any."""
        try:
            body = self._send(
                "GET", f"/{self.read_alias(resource)}/_settings/index.number_of_replicas"
            )
        except IndexMissing:
            return None
        for info in body.values():
            value = info.get("settings", {}).get("index", {}).get("number_of_replicas")
            if value is not None:
                return int(value)
        return None

    def _index_body(self, resource: str, *, bulk_load: bool) -> dict[str, Any]:
        replicas = self.replicas if self.replicas is not None else self._live_replicas(resource)
        mapping = search_mapping(resource)
        mapping["_meta"] = {
            META_KEY: {
                "prefix": self.prefix,
                "resource": resource,
                "created_at": datetime.now(UTC).isoformat(),
                # what finish_bulk_load restores; None: the cluster default
                "replicas": replicas,
            }
        }
        index_settings: dict[str, Any] = {}
        if bulk_load:
            index_settings.update(refresh_interval="-1", number_of_replicas=0)
        elif replicas is not None:
            index_settings["number_of_replicas"] = replicas
        return {"settings": {"index": index_settings}, "mappings": mapping}

    def create_index(self, resource: str, name: str, *, bulk_load: bool = False) -> None:
        self._send("PUT", f"/{name}", body=self._index_body(resource, bulk_load=bulk_load))

    def _index_meta(self, name: str) -> dict[str, Any]:
        body = self._send("GET", f"/{name}/_mapping")
        mappings = body.get(name, {}).get("mappings", {})
        meta = mappings.get("_meta", {}).get(META_KEY, {})
        return dict(meta) if isinstance(meta, dict) else {}

    def finish_bulk_load(self, name: str) -> None:
        replicas = self._index_meta(name).get("replicas")
        self._send(
            "PUT",
            f"/{name}/_settings",
            body={"index": {"refresh_interval": "1s", "number_of_replicas": replicas}},
        )
        # searchable now, not a refresh interval after the read alias moves here
        self._send("POST", f"/{name}/_refresh")

    def drop_index(self, name: str) -> None:
        with contextlib.suppress(IndexMissing):
            self._send("DELETE", f"/{name}")

    def indexes(self, resource: str) -> list[IndexInfo]:
        body = self._send(
            "GET",
            f"/{self.prefix}-*",
            params={"allow_no_indices": "true", "ignore_unavailable": "true"},
        )
        read, write = self.read_alias(resource), self.write_alias(resource)
        out = []
        for name, info in sorted(body.items()):
            meta = info.get("mappings", {}).get("_meta", {}).get(META_KEY)
            if not isinstance(meta, dict):
                meta = _auto_created(name, self.prefix, resource)
            if meta is None:
                continue
            if meta.get("prefix") != self.prefix or meta.get("resource") != resource:
                continue
            aliases = info.get("aliases", {})
            try:
                docs = self._send("POST", f"/{name}/_count")["count"]
            except IndexMissing:
                continue  # dropped since the listing (a sync retiring it): gone
            out.append(
                IndexInfo(name, resource, int(docs), read in aliases, write in aliases, dict(meta))
            )
        return out

    def set_aliases(self, resource: str, *, read: str, write: Sequence[str]) -> None:
        if not write:
            raise EngineError("set_aliases: the write alias needs at least one index")
        read_alias, write_alias = self.read_alias(resource), self.write_alias(resource)
        wanted = {read_alias: {read}, write_alias: set(write)}
        actions: list[dict[str, Any]] = []
        current = self._aliases_of(resource)
        for index, aliases in sorted(current.items()):
            for alias in sorted(aliases):
                if index not in wanted[alias]:
                    actions.append({"remove": {"index": index, "alias": alias}})
        for alias, indexes in wanted.items():
            for index in sorted(indexes):
                if alias not in current.get(index, set()):
                    actions.append({"add": {"index": index, "alias": alias}})
        if actions:
            # one request: the cluster applies all actions atomically
            self._send("POST", "/_aliases", body={"actions": actions})


def _auto_created(name: str, prefix: str, resource: str) -> dict[str, Any] | None:
    """The record of an index named as this prefix names a sync's new index but made by
    the cluster's automatic index creation (a live write racing a sync's drop of it:
    a dynamic mapping, no record of ours), or None for any other name. Listed, it is
    seen by ``index status`` and dropped as a stray or a retired index (a probe: one
    outlived ten syncs, unseen)."""
    head = f"{prefix}-{resource}-"
    stamp = name[len(head) :] if name.startswith(head) else ""
    if len(stamp) != 20:  # the scheme's whole stamp only (``new_index_name``)
        return None
    try:
        created = datetime.strptime(stamp, "%Y%m%d%H%M%S%f").replace(tzinfo=UTC)
    except ValueError:
        return None
    return {"prefix": prefix, "resource": resource, "created_at": created.isoformat(),
            "auto_created": True}  # fmt: skip
