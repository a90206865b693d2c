"""Progress output of the long commands: Rich bars on a terminal, plain lines otherwise.

Kept apart from the command modules so that Rich's progress machinery is imported only
by a command that shows progress (``cellsight --help`` stays quick).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} docs/s" if speed else "", style="progress.data.speed")


class RichProgress:
    """Bars per cell and in total; updates are batched (Rich takes a lock per call)."""

    def __init__(self, out: Console) -> None:
        self.bars = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            RateColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=out,
        )
        self.tasks: dict[str, TaskID] = {}
        self.total: TaskID | None = None
        self.pending: dict[str, int] = {}
        self.flushed = 0.0

    def phase(self, text: str) -> None:
        self.flush()
        self.bars.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {text}", highlight=False)

    def start_cells(self, cells: Sequence[tuple[str, str, int | None]]) -> None:
        for uuid, name, expected in cells:
            self.tasks[uuid] = self.bars.add_task(f"cell {name}", total=expected)
        if len(cells) > 1 or not self.tasks:
            known = [e for _, _, e in cells]
            total = sum(e or 0 for e in known) if None not in known else None
            self.total = self.bars.add_task("[bold]total", total=total)

    def advance(self, cell_uuid: str, n: int) -> None:
        self.pending[cell_uuid] = self.pending.get(cell_uuid, 0) + n
        if time.monotonic() - self.flushed > 0.2:
            self.flush()

    def flush(self) -> None:
        pending, self.pending = self.pending, {}
        for uuid, n in pending.items():
            self.bars.advance(self.tasks[uuid], n)
            if self.total is not None:
                self.bars.advance(self.total, n)
        self.flushed = time.monotonic()


class PlainProgress:
    def phase(self, text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)

    def start_cells(self, cells: Sequence[tuple[str, str, int | None]]) -> None:
        pass

    def advance(self, cell_uuid: str, n: int) -> None:
        pass


@contextmanager
def progress_for(out: Console, as_json: bool) -> Iterator[RichProgress | PlainProgress | None]:
    if as_json:
        yield None
    elif out.is_terminal:
        rich = RichProgress(out)
        with rich.bars:
            yield rich
            rich.flush()
    else:
        yield PlainProgress()
