"""What every command receives: the settings, built on first use from the root options.

Settings are loaded lazily so that ``--help`` and commands that need none start fast;
a bad configuration is raised as ``ConfigError`` and printed by the CLI boundary.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from cellsight.cli.errors import USAGE

if TYPE_CHECKING:
    from rich.table import Table

    from cellsight.cells.mappings import CellRegistry
    from cellsight.cells.operations import Operations
    from cellsight.settings import Settings


class _StdoutConsole(Console):
    def on_broken_pipe(self) -> None:
        # Rich would exit 1 (a runtime failure here): the closed-pipe code instead.
        from cellsight.cli.pipes import silence_stdout

        self.quiet = True
        raise typer.Exit(silence_stdout())


console = _StdoutConsole()
err_console = Console(stderr=True)
# Into a pipe or a journal, a status line stays one line (Rich wraps at 80 columns there:
# one message became three journald entries); on a terminal it wraps at its width.
for _console in (console, err_console):
    _console.soft_wrap = not _console.is_terminal


def print_table(table: Table) -> None:
    """On a terminal, fitted to its width; into a pipe or a file, whole, where Rich's
    80 columns cut uuids and database URLs short (an operator probe: ``cells list``
    piped to ``grep`` lost the uuid it was after)."""
    if console.is_terminal:
        console.print(table)
        return
    from rich.measure import Measurement

    # ``print(width=)`` is capped at the console's own width: a console of the table's.
    whole = Measurement.get(console, console.options.update_width(1 << 20), table).maximum
    _StdoutConsole(file=console.file, width=max(whole, console.width)).print(table)


@dataclass
class State:
    config: Path | None = None
    overrides: dict[str, object] = field(default_factory=dict)
    debug: bool = False
    _settings: Settings | None = None

    @property
    def loaded(self) -> Settings | None:
        """The settings if a command asked for them (the error boundary names the bus)."""
        return self._settings

    def settings(self) -> Settings:
        if self._settings is None:
            from cellsight.settings import load_settings

            settings = load_settings(self.config, **self.overrides)
            if settings.bus_url or settings.search_url or settings.api_db_url:
                from cellsight.clients import check_urls

                check_urls(settings)  # a URL no client could use is a bad setting
            self._settings = settings
            if "log_level" in self._settings.model_fields_set:
                import logging

                # Asked for explicitly (CELLSIGHT_LOG_LEVEL or --config): it wins over -v.
                logging.getLogger().setLevel(self._settings.log_level)
        return self._settings


def settings_of(ctx: typer.Context) -> Settings:
    state = ctx.find_root().obj
    assert isinstance(state, State), "root callback did not run"
    return state.settings()


def setting_of(ctx: typer.Context, name: str) -> str:
    """A setting as an error names it: ``api_port (CELLSIGHT_API_PORT)``, ``api_port
    (--config c.toml)`` or ``api_port (default)``."""
    from cellsight.settings import setting_label

    state = ctx.find_root().obj
    assert isinstance(state, State), "root callback did not run"
    return setting_label(state.settings(), name, state.config)


def fail(message: str, code: int = USAGE) -> NoReturn:
    """A clear one-line error and a non-zero exit (see ``cellsight.cli.errors``)."""
    error_line(message)
    raise typer.Exit(code)


def error_line(message: str) -> None:
    # The message names values as given (a field "[tags]", a foreign letter's text):
    # printed as they are, not read as markup.
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    _said[0] += 1


_said = [0]


def errors_said() -> int:
    """How many error lines this process has printed (a command's: the count before it
    against the count after)."""
    return _said[0]


def require_data_dir(
    ctx: typer.Context, *, registry: bool = False, engine: bool = False, bus: bool = False
) -> Settings:
    """The settings, after a usage error if the command would read the embedded data
    directory (the API database, the index or the bus that no URL replaces) and it is not
    there: a mistyped ``--data-dir`` would otherwise be made, empty, and answer "nothing".
    Only ``cells add``, ``cells seed``, ``index sync``, ``demo`` and the daemons make one."""
    settings = settings_of(ctx)
    what = [
        name
        for name, used, url in (
            ("the API database", registry, settings.api_db_url),
            ("the index", engine, settings.search_url),
            ("the bus", bus, settings.bus_url),
        )
        if used and not url
    ]
    if what and not settings.data_dir.exists():
        fail(
            f"no data directory at {settings.data_dir}, where {' and '.join(what)} would be "
            "(`cellsight cells add`, `cellsight demo` or `cellsight index sync` makes one; "
            "--data-dir or CELLSIGHT_DATA_DIR names another)"
        )
    return settings


# The clients commands share, built from the settings (heavy imports only when used) ---
@contextmanager
def open_registry(ctx: typer.Context, *, make: bool = False) -> Iterator[CellRegistry]:
    """The cells' registry; ``make``: the command may make the data directory."""
    from cellsight.cells.mappings import CellRegistry

    settings = settings_of(ctx) if make else require_data_dir(ctx, registry=True)
    registry = CellRegistry.from_settings(settings)
    try:
        yield registry
    finally:
        registry.close()


@contextmanager
def operations(ctx: typer.Context) -> Iterator[Operations]:
    """Cluster operations whose notifications go through the cells' outboxes to the bus."""
    from cellsight.cells.operations import Operations
    from cellsight.cells.outbox import Outbox
    from cellsight.clients import build_notifier

    # The bus too: a mistyped directory's new bus would take what the outboxes relay
    # where no indexer reads it.
    settings = require_data_dir(ctx, registry=True, bus=True)
    with open_registry(ctx) as registry, build_notifier(settings) as notifier:
        relay = Outbox(notifier, lease_seconds=settings.outbox_lease)
        yield Operations(
            registry,
            notifier,
            publisher_id=settings.publisher_id,
            default_availability_zone=settings.default_availability_zone,
            relay=relay,
        )


def canonical_uuid(value: str | None) -> str | None:
    """An option's or argument's uuid as ``uuid.UUID`` reads it (braces, ``urn:uuid:``,
    no hyphens, either case), in the form the cells store; a usage error otherwise. The
    HTTP API reads these spellings; the CLI said "not found" of an existing one."""
    import uuid

    if value is None:
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise typer.BadParameter(f"not a UUID: {value[:60]!r}") from None
