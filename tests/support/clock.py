"""A clock the test moves by hand, for code that accepts ``clock: Callable[[], float]``."""

from __future__ import annotations


class ManualClock:
    """Monotonic seconds that pass only when the test says so."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "a monotonic clock does not go back"
        self.now += seconds
