"""The CLI's logging, set up once by the root options and repeated in the processes a
command spawns (``indexer --workers N``, each indexer's writer process).

Logs are off by default: WARNING and above only, ``-v`` INFO, ``-vv`` DEBUG. The search
clients log a WARNING of their own for every 404, most of which the code expects (a
marker or lock document not there yet), and one with its traceback for every request
that fails (4,089 lines in a probe's 71 s engine freeze under ``-v``); they are kept
below ERROR unless ``-vv`` or ``--debug`` asks for them.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
LEVELS = {0: "WARNING", 1: "INFO"}
SEARCH_CLIENT_LOGGERS = ("opensearch", "opensearchpy", "elasticsearch", "elastic_transport")


class LogSetup(NamedTuple):
    """What a spawned process needs to log as the command does (picklable)."""

    level: int | str
    quiet_clients: bool


def for_options(verbose: int, debug: bool) -> LogSetup:
    return LogSetup(LEVELS.get(verbose, "DEBUG"), quiet_clients=verbose < 2 and not debug)


def configure(setup: LogSetup) -> None:
    logging.basicConfig(level=setup.level, format=FORMAT)
    level = logging.ERROR if setup.quiet_clients else logging.NOTSET
    for name in SEARCH_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(level)


def current() -> LogSetup:
    """This process's setup, for a process it spawns (a fresh interpreter logs nothing
    configured: Python's last-resort handler would print every client warning)."""
    quiet = logging.getLogger(SEARCH_CLIENT_LOGGERS[0]).level == logging.ERROR
    return LogSetup(logging.getLogger().level, quiet)
