"""Answers of Elasticsearch and OpenSearch classified, once, into the engine's errors and
write results: by HTTP status code and the error ``type`` field, never by message text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cellsight.indexer.engines.base import (
    EngineConflict,
    EngineError,
    EngineRejected,
    EngineUnavailable,
    IndexMissing,
    ScanContextLost,
    WriteResult,
    WriteStatus,
)
from cellsight.notifications.errors import brief

CONTEXT_MISSING = "search_context_missing_exception"
# Document-level failures that say "this document can never be indexed as it is".
_REJECT_TYPES = frozenset(
    {
        "strict_dynamic_mapping_exception",
        "mapper_parsing_exception",
        "document_parsing_exception",
        "illegal_argument_exception",
    }
)


def error_type_reason(body: Any) -> tuple[str, str]:
    """The ``(type, reason)`` of an error body or bulk item error, with the cause if any."""
    error = body.get("error", body) if isinstance(body, dict) else body
    if not isinstance(error, dict):
        return "error", str(error)
    kind = str(error.get("type", "error"))
    reason = str(error.get("reason", ""))
    cause = error.get("caused_by")
    # mapper_parsing_exception's own reason names the field; the cause says what was wrong
    if isinstance(cause, dict) and cause.get("reason"):
        reason = f"{reason} ({cause.get('type')}: {cause['reason']})"
    return kind, reason


def from_status(status: int, body: Any, where: str) -> EngineError:
    """An error answer as the narrowest engine error: 404 missing, 409 conflict, 408/429
    and 5xx transient, any other status refused."""
    kind, reason = error_type_reason(body)
    message = f"{where}: {status} {kind}: {reason}"
    cls: type[EngineError]
    if status == 404:
        cls = ScanContextLost if _context_missing(body) else IndexMissing
    elif status == 409:
        cls = EngineConflict
    elif status in (408, 429) or status >= 500:
        cls = EngineUnavailable
    elif 400 <= status < 500:
        cls = EngineRejected
    else:
        cls = EngineError
    return cls(message, status=status, body=body)


def _context_missing(body: Any) -> bool:
    """A search's point in time (its search context) no longer exists."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return False
    causes = [error, error.get("caused_by"), *(error.get("root_cause") or [])]
    return any(isinstance(c, dict) and c.get("type") == CONTEXT_MISSING for c in causes)


def classify_item(item: dict[str, Any]) -> WriteResult:
    """One bulk response item → OK, STALE, REJECTED or RETRY."""
    status = int(item.get("status", 500))
    if 200 <= status < 300:
        return WriteResult(WriteStatus.OK)
    kind, reason = error_type_reason(item.get("error") or {})
    if status == 409 and kind == "version_conflict_engine_exception":
        return WriteResult(WriteStatus.STALE)
    if status == 400 or kind in _REJECT_TYPES:
        return WriteResult(WriteStatus.REJECTED, f"{kind}: {reason}")
    # 429, 5xx, 403 (cluster blocks such as the flood-stage read-only block), 404 (the
    # index went away between resolving the alias and writing): the document itself is
    # fine, so it must be written again rather than dead-lettered.
    return WriteResult(WriteStatus.RETRY, f"{status} {kind}: {reason}")


def combine(results: Sequence[WriteResult]) -> WriteResult:
    """One op's outcome over every index it was written to."""
    for status in (WriteStatus.REJECTED, WriteStatus.RETRY):
        for r in results:
            if r.status is status:
                return r
    if results and all(r.status is WriteStatus.STALE for r in results):
        return WriteResult(WriteStatus.STALE)
    return WriteResult(WriteStatus.OK)


def not_json(distribution: str, url: str, where: str, exc: BaseException) -> EngineUnavailable:
    """A 2xx whose body is empty or no JSON (a proxy in front of the cluster): the engine
    is unavailable for now; the client's message is cut short (it holds the body)."""
    return EngineUnavailable(
        f"{distribution} at {url}: {where}: an answer that is not JSON ({brief(str(exc), 200)})"
    )


def json_complaint(method: str, target: str, body: Any) -> str | None:
    """Why a client's decoded answer is no JSON object or array (None: it is one)."""
    if method == "HEAD" or isinstance(body, dict | list):
        return None
    return f"{method} {target}: answered {brief(body, 60)}"
