"""The CLI's logging, set up once by the root options and repeated in the processes a
command spawns (``indexer --workers N``, each indexer's writer process).

Logs are off by default: WARNING and above only, ``-v`` INFO, ``-vv`` DEBUG. The search
clients log a WARNING of their own for every 404, most of which the code expects (a
marker or lock document not there yet); they are kept below ERROR unless ``-v`` or
``--debug`` asks for more.
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
    return LogSetup(LEVELS.get(verbose, "DEBUG"), quiet_clients=verbose == 0 and not debug)


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
