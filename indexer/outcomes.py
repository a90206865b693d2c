"""The verdict on one message, which decides whether it is acked or dead-lettered."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Verdict(StrEnum):
    INDEXED = "indexed"
    STALE = "stale"
    IGNORED = "ignored"
    DEAD = "dead"


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    reason_code: str | None = None
    reason: str | None = None
    event_type: str | None = None
    # What the metrics need of a write, carried with the verdict so that a writer in
    # another process (``write_process``) reports through the verdicts it sends back.
    resource: str | None = field(default=None, compare=False)
    lag: float | None = field(default=None, compare=False)  # seconds, notification → write


def dead(code: str, reason: str, event_type: str | None = None) -> Outcome:
    return Outcome(Verdict.DEAD, code, reason, event_type)
