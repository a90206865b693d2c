"""A resource's concrete indexes and what each one is; the synced marker.

Roles, decided from the aliases and creation times (no extra bookkeeping to go stale):

* **serving**: behind the read alias (and normally the write alias).
* **stray**: not serving and created after the serving index, i.e. the new index of a
  sync that did not finish (killed before the swap: it may still sit behind the write
  alias). The next sync or verify, holding the maintenance lock, points the write alias
  back at the serving index and drops strays before it does anything else.
* **retired**: not serving and older: a previous serving index, kept as a rollback
  target up to ``--keep-old`` (newest first) and dropped beyond that. Live writes no
  longer reach it.

Synced marker (``engine.get_meta(marker_key(resource))``), written by a full sync right
after the read alias moved, and what the API checks before it answers from the index::

    {
      "resource": "instance",
      "index": "cellsight-instance-20250101120000000000",  # the index it describes
      "sync_id": "…", "started_at": "…+00:00", "finished_at": "…+00:00",
      "documents": 123456,              # documents in the index when it was swapped in
      "cells": {"<cell uuid>": {"name": "cell1", "rows": 61728, "documents": 61728}},
      "engine": "embedded"
    }

The index is synced when the marker exists and its ``index`` is the one behind the read
alias (``is_synced``): an index only ever fed by notifications (created empty by the
indexer's first start) has no marker, and neither has a rebuilt index whose sync died
between the swap and the marker. ``--cell`` syncs do not write the marker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from cellsight.indexer.engines.base import IndexInfo, IndexMissing, SearchEngine
from cellsight.signal_events import signals_held

MARKER = "synced:{resource}"
LAST_SYNC = "sync-report:{resource}"
LAST_VERIFY = "verify-report:{resource}"


def marker_key(resource: str) -> str:
    return MARKER.format(resource=resource)


def is_synced(engine: SearchEngine, resource: str) -> bool:
    """Whether the index behind the read alias is one a full sync completed."""
    marker = engine.get_meta(marker_key(resource))
    if not marker:
        return False
    return any(i.read and i.name == marker.get("index") for i in engine.indexes(resource))


def unmark(engine: SearchEngine, resource: str, why: str) -> None:
    """The serving index no longer answers for the cells as they are (a cell removed):
    the API serves by fan-out until the next full sync marks a new one."""
    engine.put_meta(
        marker_key(resource),
        {"resource": resource, "cleared": why, "at": datetime.now(UTC).isoformat()},
    )


def new_index_name(engine: SearchEngine, resource: str) -> str:
    # The engines' own scheme: the UTC time sorts as the creation order.
    return f"{engine.prefix}-{resource}-{datetime.now(UTC):%Y%m%d%H%M%S%f}"


def _created(info: IndexInfo) -> tuple[datetime, str]:
    raw = info.meta.get("created_at")
    try:
        when = datetime.fromisoformat(str(raw))
    except ValueError:
        when = datetime.min.replace(tzinfo=UTC)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when, info.name


@dataclass
class Layout:
    serving: IndexInfo | None
    writers: list[str]
    stray: list[IndexInfo] = field(default_factory=list)
    retired: list[IndexInfo] = field(default_factory=list)  # newest first


def layout(engine: SearchEngine, resource: str) -> Layout:
    infos = engine.indexes(resource)
    readers = [i for i in infos if i.read]
    serving = readers[0] if len(readers) == 1 else None
    out = Layout(serving, [i.name for i in infos if i.write])
    if serving is None:
        return out  # nothing to compare with: leave them all alone
    for info in infos:
        if info.name == serving.name:
            continue
        (out.stray if _created(info) > _created(serving) else out.retired).append(info)
    out.retired.sort(key=_created, reverse=True)
    return out


def clean_up(engine: SearchEngine, resource: str) -> list[str]:
    """Undo what an unfinished sync left: the write alias back on the serving index, its
    new index dropped. Call only while holding the maintenance lock. Returns the drops."""
    current = layout(engine, resource)
    if current.serving is None:
        return []
    serving = current.serving.name
    if current.writers != [serving]:
        engine.set_aliases(resource, read=serving, write=[serving])
    dropped = []
    for info in current.stray:
        engine.drop_index(info.name)
        dropped.append(info.name)
    return dropped


def made_ready(
    engine: SearchEngine, resource: str, retry: Callable[[Callable[[], Any], str], Any]
) -> list[str]:
    """A sync's or verify's first steps under its lock, each through ``retry(fn, what)``
    (a probe: a busy engine failed a run at its first request): the indexes made ready,
    then what an unfinished sync left cleaned up. Returns the drops."""
    retry(partial(engine.ensure_ready, resource), "making the indexes ready")
    dropped: list[str] = retry(partial(clean_up, engine, resource), "cleaning up")
    return dropped


def retire(engine: SearchEngine, resource: str, keep: int) -> tuple[list[str], list[str]]:
    """Drop retired indexes beyond the newest ``keep``: (dropped, kept)."""
    retired = layout(engine, resource).retired
    dropped = []
    for info in retired[keep:]:
        engine.drop_index(info.name)
        dropped.append(info.name)
    return dropped, [i.name for i in retired[:keep]]


ALIASES_NOT_RESTORED = "could not restore the aliases"


def restored_failed(problems: Sequence[str]) -> bool:
    """Whether ``restore`` could not put the aliases back (one of its ``problems``)."""
    return any(p.startswith(ALIASES_NOT_RESTORED) for p in problems)


def restore(
    engine: SearchEngine,
    resource: str,
    new: str,
    aliases: tuple[str, Sequence[str]] | None,
) -> list[str]:
    """After a failed sync: the aliases as they were (``(read, write)``), the new index
    gone. Returns what could not be done (the next sync's clean-up finishes it). Ctrl-C
    and SIGTERM wait for it: a second one stopped it half-way, and the half-built index
    kept the write alias while the sync said "nothing changed" (an interrupt probe)."""
    problems = []
    with signals_held():
        if aliases is not None:
            read, write = aliases
            try:
                engine.set_aliases(resource, read=read, write=list(write))
            except Exception as exc:
                problems.append(f"{ALIASES_NOT_RESTORED} ({exc})")
        try:
            engine.drop_index(new)
        except IndexMissing:
            pass
        except Exception as exc:
            problems.append(f"could not delete the half-built index {new} ({exc})")
    return problems


def describe_indexes(engine: SearchEngine, resource: str) -> list[dict[str, Any]]:
    current = layout(engine, resource)
    stray = {i.name for i in current.stray}
    rows = []
    for info in engine.indexes(resource):
        role = "serving" if info.read else "stray" if info.name in stray else "retired"
        if current.serving is None:
            role = "unknown (no single read index)"
        rows.append(
            {
                "name": info.name,
                "role": role,
                "documents": info.docs,
                "read_alias": info.read,
                "write_alias": info.write,
                "created_at": str(info.meta.get("created_at")),
            }
        )
    return rows
