"""The ``cellsight`` command. Each group lives in its own module; this one assembles them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from cellsight.cli.context import State, fail
from cellsight.settings import ConfigError, load_settings

app = typer.Typer(
    name="cellsight",
    help="List and query the instances of a multi-cell cluster fast.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="TOML file of settings (CELLSIGHT_* keys, lowercase)"),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help="Embedded data directory (default ./.cellsight)"),
    ] = None,
) -> None:
    overrides: dict[str, object] = {}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    try:
        settings = load_settings(config, **overrides)
    except ConfigError as exc:
        fail(str(exc))
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    ctx.obj = State(settings)


def _register() -> None:
    # Imported here so that each group module can import ``app``-free helpers only.
    from cellsight.cli import groups

    groups.register(app)


def main() -> None:
    _register()
    app()
