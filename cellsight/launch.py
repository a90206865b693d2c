"""The ``cellsight`` command's entry point: the CLI imported under a guard.

A Ctrl-C in the first moment of a command lands while Python imports the CLI (Typer,
Rich, the command groups: most of its start-up) or Typer builds the command, before the
CLI's own boundary can say anything: Python printed its traceback (an interrupt probe).
Said here in the CLI's one line instead, with nothing imported for it. Earlier still
(Python's own start, the console script's first lines) nothing of Cellsight runs yet.
A SIGTERM there still ends the process by the signal, as before any handler is installed.
"""

from __future__ import annotations

import sys

INTERRUPTED = 130  # as ``cellsight.cli.errors.INTERRUPTED``, which is not imported yet


def main() -> None:
    try:
        from cellsight.cli import app

        # Typer builds the command (a twentieth of a second) before the CLI's boundary
        # runs: an interrupt that reaches here came from outside that boundary.
        app()
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        sys.exit(INTERRUPTED)
