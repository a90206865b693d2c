"""The ``cellsight`` command: the root options and the error boundary.

The command groups are registered in one place, ``cellsight.cli.groups``. Group
modules import only Typer at the top and their heavy parts inside the commands,
so ``cellsight --help`` starts quickly.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

# Typer (>= 0.29) vendors Click: its exceptions, not the ``click`` package's, are the
# ones Click's main loop turns into usage messages.
from typer._click.core import Context
from typer._click.exceptions import ClickException, NoArgsIsHelpError
from typer.core import TyperGroup

from cellsight.cli.context import State, error_line, errors_said, fail
from cellsight.cli.errors import CLOSED_PIPE, INTERRUPTED, USAGE
from cellsight.cli.pipes import (
    flush_stdout,
    silence_stdout,
    silenced_since,
    stdout_closed,
    stdout_identity,
)


class BoundaryGroup(TyperGroup):
    """Runs a command and turns what it raises into one line and an exit code."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        # Bytes that are not UTF-8 reach Python as lone surrogates, which no database,
        # bus or file name here can take: named at once rather than failing deep inside.
        for position, arg in enumerate(sys.argv[1:] if args is None else args, start=1):
            try:
                arg.encode()
            except UnicodeEncodeError:
                error_line(f"argument {position} is not valid UTF-8: {arg[:80]!r}")
                sys.exit(USAGE)
        stdout_before = stdout_identity()
        said_before = errors_said()
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            # A pipe holds the output until exit: a reader gone by now is told here
            # (a command that failed keeps its own code).
            closed = flush_stdout()
            if closed is not None and not code:
                code = closed
            if code == INTERRUPTED and errors_said() == said_before:
                # Typer makes an interrupt before the command runs (as Click parses) a
                # silent exit 130 (an interrupt probe): said, as every other.
                error_line("interrupted")
        except NoArgsIsHelpError as exc:  # the help was printed: nothing more to say
            sys.exit(exc.exit_code)
        except ClickException as exc:
            # A bad option or value in one line naming it, like every other error here
            # (Click's own form is the usage, a hint and a boxed message).
            error_line(exc.format_message())
            sys.exit(exc.exit_code)
        except typer.Abort:
            error_line("aborted")
            sys.exit(1)
        except SystemExit as exc:
            # Rich ends a write of the help to a closed pipe itself, with exit 1: the
            # same closed pipe as a command's (``cellsight.cli.pipes``).
            if exc.code == 1 and silenced_since(stdout_before):
                sys.exit(CLOSED_PIPE)
            raise
        # Not standalone, Click returns an Exit's code, or what the command returned.
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, ClickException):
            raise
        except (Exception, KeyboardInterrupt) as exc:
            if isinstance(exc, BrokenPipeError) and stdout_closed():
                raise typer.Exit(silence_stdout()) from None  # see cellsight.cli.pipes
            state = ctx.obj
            if isinstance(state, State) and state.debug:
                raise
            from cellsight.cli.errors import describe

            loaded = state.loaded if isinstance(state, State) else None
            code, message = describe(exc, loaded.bus_url if loaded else None)
            fail(message, code=code)


app = typer.Typer(
    name="cellsight",
    cls=BoundaryGroup,
    help="List and query the instances of a multi-cell cluster fast.",
    epilog=(
        "Exit codes: 0 done; 1 runtime failure (a bus, engine or database failed or "
        "refused); 2 usage (bad option, value, setting or name); 3 lock held; "
        "130 interrupted; 141 output's reader gone (| head)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(
    ctx: typer.Context,
    config: Annotated[
        str | None,  # text, as --data-dir below: "" must be named, not read as "."
        typer.Option(
            "--config",
            metavar="PATH",
            help="TOML file of settings (the CELLSIGHT_* names, lowercase)",
        ),
    ] = None,
    data_dir: Annotated[
        # Taken as text: Click's Path type turns "" into "." before a callback sees it,
        # and an empty value must not become the working directory.
        str | None,
        typer.Option(
            "--data-dir",
            metavar="PATH",
            help="Embedded data directory (default: ./.cellsight, or CELLSIGHT_DATA_DIR)",
        ),
    ] = None,
    verbose: Annotated[
        int,
        typer.Option("--verbose", "-v", count=True, help="More log output (-v info, -vv debug)"),
    ] = 0,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the traceback of a failure instead of one line")
    ] = False,
) -> None:
    overrides: dict[str, object] = {}
    if config is not None and not config.strip():
        raise typer.BadParameter("must not be empty", param_hint="'--config'")
    if data_dir is not None:
        if not data_dir.strip():
            raise typer.BadParameter(
                "must not be empty (it would be the working directory)",
                param_hint="'--data-dir'",
            )
        from cellsight.settings import file_in_the_way

        if (file := file_in_the_way(Path(data_dir))) is not None:
            raise typer.BadParameter(
                f"{file} is a file, not a directory", param_hint="'--data-dir'"
            )
        overrides["data_dir"] = Path(data_dir)
    from cellsight.cli import logs

    logs.configure(logs.for_options(verbose, debug))
    ctx.obj = State(Path(config) if config is not None else None, overrides, debug)


def _register() -> None:
    from cellsight.cli import groups

    groups.register(app)


_register()


def main() -> None:
    app()
