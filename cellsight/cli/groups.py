"""The command groups. Add a group by importing its Typer app and adding it here."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    return None
