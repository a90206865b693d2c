"""What every command receives: the settings, built once by the root callback."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

import typer
from rich.console import Console

from cellsight.settings import Settings

console = Console()
err_console = Console(stderr=True)


@dataclass
class State:
    settings: Settings


def settings_of(ctx: typer.Context) -> Settings:
    state = ctx.find_root().obj
    assert isinstance(state, State), "root callback did not run"
    return state.settings


def fail(message: str, code: int = 2) -> NoReturn:
    """A clear one-line error and a non-zero exit, instead of a traceback."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)
