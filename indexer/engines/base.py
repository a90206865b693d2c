"""The search engine interface. Each implementation lives in its own module.

Resources are ``instance`` and ``node``. Each has a read alias (``<prefix>-<resource>``)
and a write alias (``<prefix>-<resource>-write``); a full sync builds a new concrete
index beside the live one, points the write alias at both while it loads, then swaps the
read alias atomically. ``bulk`` writes every op to every index behind the write alias.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from indexer.query.tree import SearchRequest

RESOURCES = ("instance", "node")


class EngineError(Exception):
    """Base of engine errors."""


class EngineUnavailable(EngineError):
    """Transient: connection refused, timeout, 429, 5xx. Retry; do not ack."""


class IndexMissing(EngineError):
    """The alias or index does not exist (not created, or deleted under us)."""


class WriteStatus(StrEnum):
    OK = "ok"  # created or replaced by a newer version
    STALE = "stale"  # the stored version is newer or equal: success, nothing to do
    REJECTED = "rejected"  # permanent: the engine refuses this document
    RETRY = "retry"  # transient for this item (429, 5xx): write it again later


@dataclass(frozen=True)
class WriteOp:
    resource: str
    id: str
    version: int
    document: dict[str, Any]


@dataclass(frozen=True)
class WriteResult:
    status: WriteStatus
    reason: str | None = None


@dataclass(frozen=True)
class StoredDocument:
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


class SearchEngine(abc.ABC):
    """What the indexer, bulk sync and the API need from a search engine."""

    distribution: str = "unknown"

    def __init__(self, prefix: str = "cellsight") -> None:
        self.prefix = prefix

    # Names --------------------------------------------------------------
    def read_alias(self, resource: str) -> str:
        return f"{self.prefix}-{resource}"

    def write_alias(self, resource: str) -> str:
        return f"{self.prefix}-{resource}-write"

    # Lifecycle ----------------------------------------------------------
    @abc.abstractmethod
    def ensure_ready(self, resource: str) -> None:
        """Create the first index and both aliases if the read alias does not exist."""

    @abc.abstractmethod
    def ping(self) -> None:
        """Raise ``EngineUnavailable`` unless the engine answers."""

    @abc.abstractmethod
    def close(self) -> None: ...

    # Writes --------------------------------------------------------------
    @abc.abstractmethod
    def bulk(self, ops: Sequence[WriteOp]) -> list[WriteResult]:
        """Write ops with external versions to every index behind the write alias.

        Returns one result per op, in order. An op is OK only if every target index
        took it (or already held a newer version). Raises ``EngineUnavailable`` when
        the whole request failed transiently.
        """

    @abc.abstractmethod
    def delete(self, resource: str, ids: Sequence[str]) -> int:
        """Remove documents outright (tombstone purge). Returns how many were removed."""

    @abc.abstractmethod
    def refresh(self, resource: str) -> None: ...

    # Reads ----------------------------------------------------------------
    @abc.abstractmethod
    def get(self, resource: str, doc_id: str) -> StoredDocument | None:
        """From the read alias."""

    @abc.abstractmethod
    def get_many(self, resource: str, ids: Sequence[str]) -> dict[str, StoredDocument]:
        """From the write alias's newest index (what the writer compares against)."""

    @abc.abstractmethod
    def count(self, resource: str, cell_uuid: str | None = None) -> int: ...

    @abc.abstractmethod
    def iter_versions(
        self, resource: str, cell_uuid: str | None = None, batch_size: int = 5000
    ) -> Iterator[tuple[str, int]]:
        """(id, version) of the read alias's documents in ascending id order, streamed."""

    @abc.abstractmethod
    def search(self, resource: str, request: SearchRequest) -> list[StoredDocument]:
        """One page from the read alias: the documents matching
        ``request.effective_filter()`` in ``request.order`` (a total order), at most
        ``request.limit``. Every engine returns the same ids in the same order for the
        same request (``indexer.query.tree`` defines the semantics). Raises
        ``indexer.query.prepare.QueryError`` for a request that does not fit the fields.
        """

    @abc.abstractmethod
    def iter_tombstones(self, resource: str, deleted_before: datetime) -> Iterator[str]:
        """Ids of the read alias's documents with ``deleted`` true and ``deleted_at``
        before ``deleted_before``, in ascending id order, streamed (tombstone purge)."""

    # Index management (bulk sync) -------------------------------------------
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
        self, name: str, docs: Iterator[WriteOp], chunk_size: int = 2000
    ) -> Iterator[WriteResult]:
        """Stream documents into one concrete index (bulk sync), external versions kept."""

    # Metadata (synced marker, purge floor) ---------------------------------------
    @abc.abstractmethod
    def get_meta(self, key: str) -> dict[str, Any] | None: ...

    @abc.abstractmethod
    def put_meta(self, key: str, value: dict[str, Any]) -> None: ...

    # Bulk sync and anti-entropy: one concrete index before it serves; the sync lock ----
    def count_index(self, name: str, cell_uuid: str | None = None) -> int:
        """Documents in the concrete index ``name`` (of one cell), current as of the call
        (the HTTP engines refresh it first)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement count_index")

    def iter_index_versions(
        self, name: str, cell_uuid: str | None = None, batch_size: int = 5000
    ) -> Iterator[tuple[str, int]]:
        """``iter_versions`` over the concrete index ``name`` instead of the read alias."""
        raise NotImplementedError(f"{type(self).__name__} does not implement iter_index_versions")

    def swap_meta(self, key: str, expected: dict[str, Any] | None, value: dict[str, Any]) -> bool:
        """Set ``key`` to ``value`` only if it holds ``expected`` now (``None``: absent),
        atomically against every other writer; False when it held something else."""
        raise NotImplementedError(f"{type(self).__name__} does not implement swap_meta")
