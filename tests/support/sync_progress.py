"""Sync progress for tests: ``run_sync``'s ``progress`` that acts at a chosen batch."""

from __future__ import annotations

from collections.abc import Callable, Sequence


class AfterBatches:
    """Calls ``action`` once ``n`` batches were written (in the coordinating thread, where
    a real signal lands too), and nothing else."""

    def __init__(self, n: int, action: Callable[[], None]) -> None:
        self.left, self.action = n, action

    def phase(self, text: str) -> None:
        pass

    def start_cells(self, cells: Sequence[tuple[str, str, int]]) -> None:
        pass

    def advance(self, cell_uuid: str, n: int) -> None:
        self.left -= 1
        if self.left == 0:
            self.action()
