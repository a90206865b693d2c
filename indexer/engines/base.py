"""The search engine interfaces, by role, and what they exchange. Each engine lives in its
own module(s) and implements every role.

Resources are ``instance`` and ``node``. Each has a read alias (``<prefix>-<resource>``)
and a write alias (``<prefix>-<resource>-write``); a full sync builds a new concrete
index beside the live one, points the write alias at both while it loads, then swaps the
read alias atomically. ``bulk`` writes every op to every index behind the write alias.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

if TYPE_CHECKING:
    from cellsight.query.tree import SearchRequest

RESOURCES = ("instance", "node")


class EngineError(Exception):
    """Base of engine errors. ``status`` and ``body``: the HTTP status and decoded body
    of the answer it was classified from, for the HTTP engines."""

    def __init__(self, message: str, *, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class EngineUnavailable(EngineError):
    """Transient: connection refused, timeout, 408, 429, 5xx, a busy database. Retry;
    do not ack."""


class EngineTimeout(EngineUnavailable):
    """No answer to one request within its timeout (the HTTP client's read timeout, the
    embedded search's deadline): the engine may be down, or this one request heavy."""


class IndexMissing(EngineError):
    """The alias, index or document does not exist (not created, or deleted under us)."""


class ScanContextLost(IndexMissing):
    """A scan's point in time is gone (expired past its keep-alive, or closed)."""


class EngineConflict(EngineError):
    """A compare-and-set lost: someone else wrote in between (HTTP 409)."""


class EngineRejected(EngineError):
    """The engine refused the request as it is (another 4xx): retrying will not help."""


class WriteStatus(StrEnum):
    OK = "ok"  # created or replaced by a newer version
    STALE = "stale"  # the stored version is newer or equal: success, nothing to do
    REJECTED = "rejected"  # permanent: the engine refuses this document
    RETRY = "retry"  # transient for this item (429, 5xx): write it again later


class WriteOp(NamedTuple):
    """One versioned write. A named tuple: the indexer builds one per notification, in a
    third of a frozen dataclass's time."""

    resource: str
    id: str
    version: int
    document: dict[str, Any]
    # Also replace a stored document of the same version (Elasticsearch's
    # ``external_gte``): a correction of that version's tags, never a new document. The
    # embedded engine takes it only while the stored tags are older (``tags_version``);
    # the HTTP engines cannot compare that (see README, Limits).
    same_version: bool = False


def tags_version_of(document: dict[str, Any], version: int) -> int:
    """The version of the event a document's tags came from (``cellsight.indexer.retag``):
    its ``tags_version``, or, without one (written before it existed, a sync's row), the
    document's own version."""
    value = document.get("tags_version")
    return value if type(value) is int else version


class WriteResult(msgspec.Struct, frozen=True):
    """Structs, like ``WriteOp``'s named tuple: engines make one per document, and a
    frozen dataclass's ``__init__`` costs several times a Struct's."""

    status: WriteStatus
    reason: str | None = None
    # For a STALE instance: the tags version of the stored document it met, where the
    # engine knows it (the embedded engine; an HTTP conflict does not say).
    tags_version: int | None = None


class StoredDocument(msgspec.Struct, frozen=True):
    id: str
    version: int
    document: dict[str, Any]


@dataclass
class IndexInfo:
    name: str
    resource: str
    docs: int
    read: bool = False
    write: bool = False
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do, declared, so callers branch on flags, not on classes."""

    # Scans (``iter_versions``, ``iter_tombstones``) read one point-in-time snapshot.
    point_in_time: bool = False
    # ``submit_bulk`` runs up to this many bulk requests at once (1: one write at a time,
    # serialised on the engine's write lock, as the embedded engine is).
    max_in_flight: int = 1
    # ``reopener()`` gives a picklable factory: worker processes open their own engine
    # on the same storage (a local file), so a bulk sync can build in processes.
    worker_processes: bool = False


class Names:
    """Alias names. Resources are ``instance`` and ``node``."""

    def __init__(self, prefix: str = "cellsight") -> None:
        self.prefix = prefix

    def read_alias(self, resource: str) -> str:
        return f"{self.prefix}-{resource}"

    def write_alias(self, resource: str) -> str:
        return f"{self.prefix}-{resource}-write"


class DocumentStore(abc.ABC):
    """Documents read and write: the indexer's role."""

    @abc.abstractmethod
    def bulk(self, ops: Sequence[WriteOp]) -> list[WriteResult]:
        """Write ops with external versions to every index behind the write alias.

        Returns one result per op, in order. An op is OK only if every target index
        took it (or already held a newer version). Raises ``EngineUnavailable`` when
        the whole request failed transiently.
        """

    def submit_bulk(self, ops: Sequence[WriteOp]) -> Future[list[WriteResult]]:
        """``bulk`` without waiting: a future of its results. Blocks while
        ``capabilities.max_in_flight`` requests are already running, so a caller that
        keeps submitting is paced by the engine. Futures complete in any order; a
        caller acks in submission order by waiting on the oldest first (see
        ``cellsight.indexer.engines.bulk_queue``). Versions are external, so two requests in flight
        with the same id still leave the higher version stored.

        This default runs ``bulk`` now, in the caller's thread (one write in flight)."""
        future: Future[list[WriteResult]] = Future()
        try:
            future.set_result(self.bulk(ops))
        except Exception as exc:
            future.set_exception(exc)
        return future

    @abc.abstractmethod
    def delete(self, resource: str, ids: Sequence[str]) -> int:
        """Remove documents outright (tombstone purge). Returns how many were removed."""

    @abc.abstractmethod
    def refresh(self, resource: str) -> None: ...

    @abc.abstractmethod
    def get(self, resource: str, doc_id: str) -> StoredDocument | None:
        """From the read alias."""

    @abc.abstractmethod
    def get_many(
        self,
        resource: str,
        ids: Sequence[str],
        *,
        fields: Sequence[str] | None = None,
        index: str | None = None,
    ) -> dict[str, StoredDocument]:
        """From the write alias's indexes, the highest version of each id (what the
        writer compares against: during a sync the new index lacks what it has not
        loaded yet), or from the concrete ``index`` alone (what a sync's check of its
        new index reads). With ``fields``, each document holds only those of them it
        stores (the engine may add others): the writer needs a stored document's tags,
        not its 3 KB."""


class Search(abc.ABC):
    """Queries and scans. ``index``: a concrete index (bulk sync, before it serves)
    instead of the read alias; the HTTP engines refresh it first, since a bulk-loaded
    index is only searchable as of its last refresh."""

    @abc.abstractmethod
    def search(self, resource: str, request: SearchRequest) -> list[StoredDocument]:
        """One page from the read alias: the documents matching
        ``request.effective_filter()`` in ``request.order`` (a total order), at most
        ``request.limit``. Every engine returns the same ids in the same order for the
        same request (``cellsight.query.tree`` defines the semantics). Raises
        ``cellsight.query.prepare.QueryError`` for a request that does not fit the fields.
        """

    @abc.abstractmethod
    def count(
        self, resource: str, cell_uuid: str | None = None, *, index: str | None = None
    ) -> int:
        """Documents (of one cell), current as of the call."""

    @abc.abstractmethod
    def iter_versions(
        self,
        resource: str,
        cell_uuid: str | None = None,
        batch_size: int = 5000,
        *,
        index: str | None = None,
    ) -> Iterator[tuple[str, int]]:
        """(id, version) of the documents in ascending id order, streamed."""

    @abc.abstractmethod
    def iter_tombstones(self, resource: str, deleted_before: datetime) -> Iterator[str]:
        """Ids of the read alias's documents with ``deleted`` true and ``deleted_at``
        before ``deleted_before``, in ascending id order, streamed (tombstone purge)."""


class IndexAdmin(abc.ABC):
    """Concrete indexes and aliases: bulk sync's role. A full sync builds a new index
    beside the live one, points the write alias at both while it loads, then swaps the
    read alias atomically."""

    @abc.abstractmethod
    def ensure_ready(self, resource: str) -> None:
        """Create the first index and both aliases if the read alias does not exist."""

    @abc.abstractmethod
    def new_index_name(self, resource: str) -> str: ...

    @abc.abstractmethod
    def create_index(self, resource: str, name: str, *, bulk_load: bool = False) -> None:
        """A concrete index with the generated mapping; ``bulk_load`` turns refresh off
        and replicas to 0 until ``finish_bulk_load``."""

    @abc.abstractmethod
    def finish_bulk_load(self, name: str) -> None: ...

    @abc.abstractmethod
    def drop_index(self, name: str) -> None: ...

    @abc.abstractmethod
    def indexes(self, resource: str) -> list[IndexInfo]:
        """Concrete indexes of a resource with doc counts and which aliases point at them."""

    @abc.abstractmethod
    def set_aliases(self, resource: str, *, read: str, write: Sequence[str]) -> None:
        """Atomically point the read alias at ``read`` and the write alias at ``write``."""

    @abc.abstractmethod
    def bulk_index(
        self,
        name: str,
        docs: Iterator[WriteOp],
        chunk_size: int = 2000,
        *,
        lock: AbstractContextManager[Any] | None = None,
    ) -> Iterator[WriteResult]:
        """Stream documents into one concrete index (bulk sync), external versions kept.

        ``lock`` is held around each chunk's write and not while it is prepared, so
        loaders in several processes prepare at once and take turns writing (an engine
        with one writer at a time would otherwise have them wait on its own lock)."""


class MetaStore(abc.ABC):
    """Small JSON values (synced marker, purge floor) and the sync lock's compare-and-set."""

    @abc.abstractmethod
    def get_meta(self, key: str) -> dict[str, Any] | None: ...

    @abc.abstractmethod
    def put_meta(self, key: str, value: dict[str, Any]) -> None: ...

    @abc.abstractmethod
    def swap_meta(self, key: str, expected: dict[str, Any] | None, value: dict[str, Any]) -> bool:
        """Set ``key`` to ``value`` only if it holds ``expected`` now (``None``: absent),
        atomically against every other writer; False when it held something else."""


class SearchEngine(Names, DocumentStore, Search, IndexAdmin, MetaStore):
    """Every role, as the indexer, bulk sync and the API get it from ``build_engine``."""

    distribution: str = "unknown"
    capabilities: Capabilities = Capabilities()

    @abc.abstractmethod
    def ping(self, timeout: float | None = None) -> None:
        """Raise ``EngineUnavailable`` unless the engine answers (within ``timeout``
        seconds where it waits on a peer; default: its own request timeout)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def store_identity(self) -> Hashable:
        """What tells the store behind this engine from one put in its place (the embedded
        index's file: its device and inode), read cheaply enough for every request; the
        API re-reads the synced marker when it changes. ``None`` where no cheap sign
        exists (the HTTP engines: a wiped cluster is seen at the next probe)."""
        return None

    def reopener(self) -> Callable[[], SearchEngine]:
        """A picklable factory of this engine for another process: the indexer's writer
        process, and (when ``capabilities.worker_processes``: a local file that processes
        can share) a bulk sync's builders."""
        raise NotImplementedError(f"{type(self).__name__} cannot be reopened in a process")
