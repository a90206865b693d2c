"""The verdict on one message, which decides whether it is acked or dead-lettered."""

from __future__ import annotations

from dataclasses import dataclass
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


def dead(code: str, reason: str, event_type: str | None = None) -> Outcome:
    return Outcome(Verdict.DEAD, code, reason, event_type)
