"""The service fixtures themselves: a missing service skips on a developer machine and
fails under ``CELLSIGHT_REQUIRE_SERVICES=1``, for every service; and the scaffolding
stays in one place (``tests/support/services.py``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import services
from tests.support.services import port_open

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# One test per service, each reaching it only through the shared fixtures.
ONE_PER_SERVICE = [
    "tests/notifications/test_notifier_rabbitmq.py::test_every_message_delivered_exactly",
    "tests/cells/test_cells_contract.py::test_schema_has_tables_and_indexes[postgresql]",
    "tests/cells/test_cells_contract.py::test_schema_has_tables_and_indexes[mariadb]",
    "tests/indexer/test_http_engines.py::test_build_engine_detects_osmem_as_opensearch",
]


PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:xdist", "-rs"]


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    assert not port_open("127.0.0.1", port)
    return port


def _run_without_services(require: bool) -> tuple[int, str]:
    """The tests above, in a fresh pytest, with every service pointed at nothing."""
    port = _closed_port()
    env = dict(os.environ)
    env.update(
        {
            "CELLSIGHT_TEST_AMQP_URL": f"amqp://guest:guest@127.0.0.1:{port}//",
            "CELLSIGHT_TEST_POSTGRES_URL": f"postgresql+psycopg://postgres@127.0.0.1:{port}/x",
            "CELLSIGHT_TEST_MARIADB_URL": f"mysql+pymysql://root@127.0.0.1:{port}/x",
            "OSMEM_SERVER_BIN": str(ROOT / "no-such-osmem-server"),
        }
    )
    env.pop("CELLSIGHT_REQUIRE_SERVICES", None)
    if require:
        env["CELLSIGHT_REQUIRE_SERVICES"] = "1"
    done = subprocess.run(
        [*PYTEST, *ONE_PER_SERVICE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout + done.stderr


def _summary(output: str) -> dict[str, int]:
    last = output.strip().splitlines()[-1]
    outcomes = ("passed", "failed", "skipped", "error", "errors", "xfailed", "xpassed")
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", last) if word in outcomes}


def test_missing_services_skip_on_a_developer_machine() -> None:
    code, output = _run_without_services(require=False)
    assert code == 0, output
    assert _summary(output) == {"skipped": len(ONE_PER_SERVICE)}, output
    for what in ("RabbitMQ", "PostgreSQL", "MariaDB", "osmem-server"):
        assert f"{what}" in output and "unavailable" in output, output


def test_missing_services_fail_under_require_services() -> None:
    code, output = _run_without_services(require=True)
    assert code != 0, output
    counts = _summary(output)
    assert counts.get("passed", 0) == counts.get("skipped", 0) == 0, output
    assert counts.get("error", 0) + counts.get("errors", 0) == len(ONE_PER_SERVICE), output
    assert output.count("CELLSIGHT_REQUIRE_SERVICES=1") >= len(ONE_PER_SERVICE), output


def test_unavailable_reads_the_switch_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services, "REQUIRE_SERVICES", True)
    with pytest.raises(pytest.fail.Exception, match=r"X is required"):
        services.unavailable("X")
    monkeypatch.setattr(services, "REQUIRE_SERVICES", False)
    with pytest.raises(pytest.skip.Exception, match="X unavailable"):
        services.unavailable("X")


def _sources() -> dict[Path, str]:
    return {p: p.read_text() for p in TESTS.rglob("*.py") if p.resolve() != Path(__file__)}


@pytest.mark.parametrize(
    ("pattern", "what"),
    [
        (
            r"(environ|getenv)\W[^\n]*CELLSIGHT_REQUIRE_SERVICES",
            "reads the require-services switch",
        ),
        (r"OsmemServer\.start\(", "starts an osmem server"),
        (r"CREATE DATABASE|DROP DATABASE", "creates or drops a database"),
        (r"port_open\(", "probes a service port"),
    ],
)
def test_service_scaffolding_lives_in_one_place(pattern: str, what: str) -> None:
    elsewhere = sorted(
        str(p.relative_to(ROOT))
        for p, text in _sources().items()
        if re.search(pattern, text) and p.name != "services.py"
    )
    assert elsewhere == [], f"only tests/support/services.py {what}; also: {elsewhere}"


def test_no_test_imports_a_conftest() -> None:
    importing = sorted(
        str(p.relative_to(ROOT))
        for p, text in _sources().items()
        if re.search(r"^\s*(from|import) (tests\.)?(\w+\.)*conftest\b", text, re.MULTILINE)
    )
    assert importing == [], f"shared helpers live in tests/support/: {importing}"


def test_what_the_tests_declare_on_rabbitmq_is_removed(
    rabbitmq_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The names ``bus_settings`` gives, declared as the indexer declares them, are gone
    after ``remove_rabbitmq_names`` (the session's last fixture step)."""
    from kombu import Connection

    from cellsight.clients import build_consumer_config
    from cellsight.notifications import queues
    from tests.support.indexing import bus_settings

    monkeypatch.setattr(services, "_RABBITMQ_NAMES", [])  # only this test's names
    config = build_consumer_config(bus_settings(tmp_path, "rabbitmq"))
    exchange = queues.notifications_exchange(config.exchange)
    dlx = queues.dead_letter_exchange(config.dead_letter_exchange)
    with Connection(rabbitmq_url) as conn:
        queues.indexer_queue(config.queue, exchange)(conn.channel()).declare()
        queues.dead_letter_queue(config.dead_letter_queue, dlx)(conn.channel()).declare()
        for name in (config.queue, config.dead_letter_queue):
            conn.channel().queue_declare(name, passive=True)
        for name in (config.exchange, config.dead_letter_exchange):
            conn.channel().exchange_declare(name, "topic", passive=True)
        assert services.remove_rabbitmq_names() == 4
        for name in (config.queue, config.dead_letter_queue):
            with pytest.raises(conn.channel_errors):
                conn.channel().queue_declare(name, passive=True)
        for name in (config.exchange, config.dead_letter_exchange):
            with pytest.raises(conn.channel_errors):
                conn.channel().exchange_declare(name, "topic", passive=True)
