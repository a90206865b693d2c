"""Tags under reordering: which tags an instance document holds, and of which version.

Nova's action payloads (``instance.power_off.end`` and the like) carry no tags; only
``instance.update`` and a few others do. A document written from a tag-less event keeps
the newest tags known below its version, and records in ``tags_version`` the version of
the event they came from (0: none known yet). An event that carried tags and arrived
after a newer tag-less one is stale as a whole, yet its tags may be newer than the
stored ones: if its version is above the stored ``tags_version``, the stored document
is rewritten at its own version with those tags (``WriteOp.same_version``). The tags
then converge to those of the newest event that carried any, in whatever order the
events arrive. A document without ``tags_version`` (written before it existed, or by a
sync, whose rows carry tags) has tags as new as itself.

Pure functions: the writer reads and writes (``BatchWriter``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from cellsight.indexer.engines.base import StoredDocument, WriteOp, tags_version_of

if TYPE_CHECKING:
    from cellsight.indexer.planning import Planned

# Rounds of read and same-version write before a retag gives up: each lost round means
# another writer stored a newer version in between (``--workers N``).
ATTEMPTS = 5


def needed(op: WriteOp, stored: StoredDocument | None) -> bool:
    """Whether ``op``'s tags are newer than the stored document's (None: none stored)."""
    return stored is not None and op.version > tags_version_of(stored.document, stored.version)


def carries_tags(op: WriteOp) -> bool:
    """The op's tags came with its own event (not merged from another version)."""
    return op.resource == "instance" and op.document.get("tags_version") == op.version


def merge_tags(planned: Sequence[Planned], stored: dict[str, StoredDocument]) -> None:
    """Give documents built from tag-less payloads the newest tags known below them
    (stored, or from an event of the same batch) and those tags' version."""
    # (document version, tags version, tags) per id
    sources: dict[str, list[tuple[int, int, list[str]]]] = {}
    for doc_id, s in stored.items():
        tags = s.document.get("tags")
        if isinstance(tags, list):
            sources.setdefault(doc_id, []).append(
                (s.version, tags_version_of(s.document, s.version), tags)
            )
    for p in planned:
        doc = p.op.document
        if "tags" in doc:
            version = tags_version_of(doc, p.op.version)
            sources.setdefault(p.op.id, []).append((p.op.version, version, doc["tags"]))
    for p in planned:
        doc = p.op.document
        if p.op.resource != "instance" or "tags" in doc:
            continue
        known = sorted(sources.get(p.op.id, []), key=lambda s: s[0])
        below = [s for s in known if s[0] < p.op.version]
        source = below[-1] if below else known[-1] if known else (0, 0, [])
        doc["tags"] = list(source[2])
        doc["tags_version"] = source[1]


def newest_carrying_tags(ops: Iterable[WriteOp]) -> dict[str, WriteOp]:
    """Per id, the newest of the ops that carried their own tags."""
    out: dict[str, WriteOp] = {}
    for op in ops:
        if carries_tags(op) and (op.id not in out or op.version > out[op.id].version):
            out[op.id] = op
    return out


def retag_ops(stale: dict[str, WriteOp], stored: dict[str, StoredDocument]) -> list[WriteOp]:
    """The writes that give stored documents the tags of stale events newer than theirs.

    A document stored at a version below the op's (dropped and rewritten since the op
    was found stale) gets the op itself."""
    out: list[WriteOp] = []
    for doc_id, op in stale.items():
        s = stored.get(doc_id)
        if s is None or not needed(op, s):
            continue  # purged, or its tags are as new as the event's
        if s.version < op.version:
            out.append(op)
            continue
        doc = dict(s.document)
        doc["tags"] = list(op.document["tags"])
        doc["tags_version"] = op.version
        out.append(WriteOp(op.resource, doc_id, s.version, doc, same_version=True))
    return out
