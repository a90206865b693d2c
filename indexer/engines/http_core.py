"""What every role of the HTTP engines shares: the client hooks, alias lookups, the one
scan loop, and the pool behind ``submit_bulk``.

The client modules (``elasticsearch``, ``opensearch``) implement the hooks: send one
request, run the client's streaming bulk helper, open and close a point in time. Each
hook raises engine errors already classified by ``http_errors.from_status`` (or
``EngineUnavailable`` when no answer came), so the roles never see a client exception.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from cellsight.indexer.engines.base import (
    Capabilities,
    EngineError,
    EngineRejected,
    EngineUnavailable,
    IndexMissing,
    Names,
    ScanContextLost,
    SearchEngine,
    WriteOp,
    WriteResult,
)
from cellsight.indexer.retries import retrying
from cellsight.urls import redact_url

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger(__name__)

# A bulk header line and its optional source line, as the clients' helpers take them.
BulkAction = tuple[dict[str, Any], dict[str, Any] | None]
# One item of a bulk response: (ok, {op_type: item}).
BulkItem = tuple[bool, dict[str, Any]]

META_KEY = "cellsight"
# Large enough for a few thousand instance documents per request, small enough to stay
# far below http.max_content_length (100 MB) and to keep one request's memory modest.
MAX_CHUNK_BYTES = 10 * 1024 * 1024
# Elasticsearch and OpenSearch refuse from+size beyond index.max_result_window.
MAX_PAGE = 10_000
# How long a scan's point in time lives between two pages.
PIT_KEEP_ALIVE = "2m"
PIT_REOPENS = 3  # points in time a scan opens again in a row when one expires under it
# Bulk requests in flight by default: Kafka Connect's Elasticsearch sink default.
MAX_IN_FLIGHT = 5
# Connections kept per node, at least one per bulk request in flight. A concurrent
# request beyond the pool opens a connection and drops it afterwards, with a warning
# each time (opensearch-py's urllib3 pool kept one; Elasticsearch's client keeps 10). A
# kept connection is only opened when requests run at once, so the cap is set by what
# one process may send at once: the API's request threads (AnyIO's 40), a bulk sync's
# worker threads, the indexer's bulk requests in flight.
POOL_CONNECTIONS = 64


class HttpCore(Names):
    """``timeout`` bounds every request; bulk requests get ``bulk_timeout`` (default six
    times ``timeout``) because a large bulk legitimately takes longer than a lookup.
    ``replicas`` pins the replica count of new indexes; by default a new index keeps the
    live index's explicit count, or else the cluster default. ``max_in_flight`` bounds
    the bulk requests ``submit_bulk`` runs at once."""

    distribution = "unknown"

    @abc.abstractmethod
    def _make_client(self, url: str, timeout: float, options: dict[str, Any]) -> Any:
        """The client, with ``options`` over the no-retry defaults."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "cellsight",
        timeout: float = 5.0,
        bulk_timeout: float | None = None,
        replicas: int | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
        **client_options: Any,
    ) -> None:
        """``client_options`` go to the client's constructor (auth, TLS, transport). The
        client does not retry: the consumer retries whole batches with backoff, and client
        retries on top would multiply the time a caller waits on a dead cluster."""
        super().__init__(prefix)
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        # The real URL stays out of repr and messages, but a writer process needs it.
        self._reopen: Callable[[], Any] = partial(
            type(self),
            url,
            prefix=prefix,
            timeout=timeout,
            bulk_timeout=bulk_timeout,
            replicas=replicas,
            max_in_flight=max_in_flight,
            **client_options,
        )
        self.pool_connections = max(POOL_CONNECTIONS, max_in_flight)
        self.client = self._make_client(url, timeout, client_options)
        self.url = redact_url(url)  # for messages; the client is given the real one
        self.timeout = timeout
        self.bulk_timeout = bulk_timeout if bulk_timeout is not None else timeout * 6
        self.replicas = replicas
        self.capabilities = Capabilities(point_in_time=True, max_in_flight=max_in_flight)
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, prefix={self.prefix!r})"

    def reopener(self) -> Callable[[], SearchEngine]:
        """Another client of the same cluster, for a writer process."""
        return self._reopen

    # Client hooks -------------------------------------------------------------
    @abc.abstractmethod
    def _send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        timeout: float | None = None,
    ) -> Any:
        """The decoded body of a 2xx answer; a classified ``EngineError`` otherwise.
        ``timeout``: seconds for this request (default: the engine's)."""

    @abc.abstractmethod
    def _stream_bulk(
        self, actions: Iterable[BulkAction], *, chunk_size: int, timeout: float
    ) -> Iterator[BulkItem]:
        """The client's streaming bulk helper over ``actions``: one item per action, in
        order, never raising for item errors, with no retries. Request failures are
        raised as in ``_send``."""

    @abc.abstractmethod
    def _open_pit(self, target: str) -> str:
        """A point in time on ``target``, ``PIT_KEEP_ALIVE`` long: its id."""

    @abc.abstractmethod
    def _close_pit(self, pit: str) -> None: ...

    # Roles the others call (declared here so each role module stands on its own).
    @abc.abstractmethod
    def bulk(self, ops: Sequence[WriteOp]) -> list[WriteResult]: ...

    @abc.abstractmethod
    def drop_index(self, name: str) -> None: ...

    # Lifecycle --------------------------------------------------------------
    def ping(self, timeout: float | None = None) -> None:
        try:
            self._send("GET", "/", timeout=timeout)
        except EngineError as exc:
            if exc.status is None:
                raise
            raise EngineUnavailable(f"{self.distribution} at {self.url}: {exc}") from exc

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self.client.close()

    def submit_bulk(self, ops: Sequence[WriteOp]) -> Future[list[WriteResult]]:
        self._slots.acquire()  # the bound: a caller submitting faster waits here
        try:
            future = self._executor().submit(self.bulk, ops)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _done: self._slots.release())
        return future

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.capabilities.max_in_flight, thread_name_prefix="bulk"
                )
            return self._pool

    # Names and aliases ------------------------------------------------------------
    def new_index_name(self, resource: str) -> str:
        return f"{self.prefix}-{resource}-{datetime.now(UTC):%Y%m%d%H%M%S%f}"

    def meta_alias(self) -> str:
        return f"{self.prefix}-meta"

    def _alias_indexes(self, alias: str) -> list[str]:
        """The concrete indexes behind ``alias``; ``IndexMissing`` if it does not exist."""
        body = self._send("GET", f"/_alias/{alias}")
        names = sorted(name for name, info in body.items() if isinstance(info, dict))
        if not names:
            raise IndexMissing(f"{self.distribution}: alias [{alias}] points at no index")
        return names

    def _aliases_of(self, resource: str) -> dict[str, set[str]]:
        """Index name → which of this resource's aliases point at it."""
        wanted = (self.read_alias(resource), self.write_alias(resource))
        try:
            body = self._send("GET", f"/_alias/{','.join(wanted)}")
        except IndexMissing as exc:
            # one alias missing: the body still lists the indexes of the other
            body = exc.body if isinstance(exc.body, dict) else {}
        out: dict[str, set[str]] = {}
        for name, info in body.items():
            if isinstance(info, dict):
                out[name] = set(info.get("aliases", {})) & set(wanted)
        return out

    def _creation_dates(self, target: str) -> dict[str, int]:
        body = self._send("GET", f"/{target}/_settings/index.creation_date")
        return {
            name: int(info["settings"]["index"]["creation_date"]) for name, info in body.items()
        }

    def _newest_write_index(self, resource: str) -> str:
        dates = self._creation_dates(self.write_alias(resource))
        return max(dates, key=lambda name: (dates[name], name))

    def _target(self, resource: str, index: str | None) -> str:
        """The read alias, or a concrete index made searchable first (a bulk-loaded
        index is only searchable as of its last refresh)."""
        if index is None:
            return self.read_alias(resource)
        self._send("POST", f"/{index}/_refresh")
        return index

    # The scan --------------------------------------------------------------------
    def _scan(self, target: str, query: dict[str, Any], *, size: int) -> Iterator[dict[str, Any]]:
        """Every hit of ``query`` on ``target`` in ascending id order, ``size`` per page,
        by ``search_after``: over one point in time where the cluster grants one, so a
        long scan sees one snapshot. Hits carry ``_id`` and ``_version``, no source."""
        body: dict[str, Any] = {
            "query": query,
            # Sort on the uuid keyword, not _id: sorting on _id needs fielddata that
            # Elasticsearch 8+ disables by default. Documents' ids are their uuid.
            "sort": [{"uuid": "asc"}],
            "size": max(1, min(size, MAX_PAGE)),
            "_source": False,
            "version": True,
            "track_total_hits": False,
        }
        opening = partial(retrying, partial(self._pit_or_none, target), f"opening {target}")
        pit, reopened = opening(), 0
        try:
            while True:
                body.pop("pit", None)
                if pit is not None:
                    body["pit"] = {"id": pit, "keep_alive": PIT_KEEP_ALIVE}
                path = f"/{target}/_search" if pit is None else "/_search"
                # A page is a read: one the engine was too busy to answer is asked again,
                # not the whole scan failed (a probe: a verify beside a busy indexer
                # left cells "not compared: EngineTimeout").
                try:
                    answer = retrying(
                        partial(self._send, "POST", path, body=body), f"reading {target}"
                    )
                except ScanContextLost:
                    # Expired (a gap past the keep-alive: repairs between pages retried
                    # through an outage): a new one, on from the last id read.
                    if pit is None or reopened == PIT_REOPENS:
                        raise
                    pit, reopened = opening(), reopened + 1
                    continue
                pit, reopened = answer.get("pit_id", pit), 0  # a newer id may be handed out
                hits = answer["hits"]["hits"]
                yield from hits
                if len(hits) < body["size"]:
                    return
                body["search_after"] = hits[-1]["sort"]
        finally:
            if pit is not None:
                try:
                    self._close_pit(pit)
                except EngineError as exc:  # it expires by itself after the keep-alive
                    log.debug("closing point in time on %s: %s", target, exc)

    def _pit_or_none(self, target: str) -> str | None:
        if not self.capabilities.point_in_time:
            return None
        try:
            return self._open_pit(target)
        except EngineRejected as exc:
            # A compatible server without the point-in-time API (an older or partial
            # implementation): page without one, as before, and stop asking.
            log.warning(
                "%s at %s refuses a point in time (%s); scans page without",
                self.distribution,
                self.url,
                exc,
            )
            self.capabilities = replace(self.capabilities, point_in_time=False)
            return None
