"""The reference decoder's plan of a body, for the tests that hold the compiled decode
path (``planning.plan_fast``) to it, and the comparisons of a result with it."""

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


def dead_reason_code(result: Planned | Outcome) -> str | None:
    """The reason code of ``result``, which must be a dead letter's verdict."""
    assert isinstance(result, Outcome) and result.verdict is Verdict.DEAD
    return result.reason_code


def same_plan(fast: Planned, reference: Planned | Outcome) -> None:
    assert isinstance(reference, Planned)
    assert (fast.op.id, fast.op.version) == (reference.op.id, reference.op.version)
    assert fast.op.document | {"indexed_at": None} == reference.op.document | {"indexed_at": None}


def same_verdict(got: Planned | Outcome | None, reference: Planned | Outcome) -> None:
    if isinstance(reference, Planned):
        assert isinstance(got, Planned)
        same_plan(got, reference)
    else:
        assert isinstance(got, Outcome) and got.reason_code == reference.reason_code
