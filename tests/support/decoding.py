"""The reference decoder's plan of a body, for the tests that hold the compiled decode
path (``planning.plan_fast``) to it."""

from __future__ import annotations

from cellsight.indexer.outcomes import Outcome, Verdict
from cellsight.indexer.planning import EventInfo, Planned, map_payload
from cellsight.notifications.envelope import decode
from cellsight.notifications.errors import NotificationError


def reference_plan(raw: bytes) -> Planned | Outcome:
    """What the reference (pydantic) path makes of ``raw``: a plan, or a verdict (a
    contract error is a dead letter with its reason code)."""
    try:
        n = decode(raw)
    except NotificationError as exc:
        return Outcome(Verdict.DEAD, exc.reason)
    return map_payload(0, n.payload, n.event, EventInfo(n.event_type, n.timestamp))


def reference_planned(raw: bytes) -> Planned | None:
    """The reference's plan of ``raw``, or None if it plans none."""
    result = reference_plan(raw)
    return result if isinstance(result, Planned) else None
