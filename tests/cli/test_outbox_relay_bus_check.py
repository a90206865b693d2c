"""``outbox relay`` with nothing waiting never opened the bus: a wrong password, vhost or
port went unnoticed (exit 0) until a notification first waited, hours later for a relay
kept as a service. ``--every`` now logs in and declares the exchange and queues first, a
pass that found nothing waiting does so after it, and both fail in one line naming the
bus (a pass with rows to publish reports each cell's, as before)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from kombu import Connection, Queue

from cellsight.cli.errors import RUNTIME
from tests.cli.test_cli_errors import SECRET, assert_one_line_error, cellsight, closed_port
from tests.support.services import rabbitmq_names

FORMS = {"once": [], "every": ["--every", "5"]}


def _amqp(rabbitmq_url: str) -> sa.URL:
    return sa.make_url(rabbitmq_url.replace("amqp://", "mysql://"))  # parse user/host only


@pytest.mark.services
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", ["password", "vhost", "redis user"])
def test_a_relay_the_bus_turns_away_fails_with_nothing_waiting(
    tmp_path: Path, rabbitmq_url: str, redis_url: str, form: str, case: str
) -> None:
    amqp, redis = _amqp(rabbitmq_url), sa.make_url(redis_url.replace("redis://", "mysql://"))
    url, needle = {
        "password": (
            f"amqp://{amqp.username}:{SECRET}@{amqp.host}:{amqp.port}//",
            "ACCESS_REFUSED",
        ),
        "vhost": (
            f"amqp://{amqp.username}:{amqp.password}@{amqp.host}:{amqp.port}/no-such-vhost",
            "NOT_ALLOWED",
        ),
        "redis user": (
            f"redis://no-such-user:{SECRET}@{redis.host}:{redis.port}/0",
            "AuthenticationError",
        ),
    }[case]
    # ``--every`` would run until SIGTERM: the subprocess's timeout fails a relay that
    # starts without looking.
    result = cellsight(
        tmp_path / "d", "outbox", "relay", *FORMS[form], env={"CELLSIGHT_BUS_URL": url}
    )
    assert_one_line_error(result, RUNTIME, needle, "check the user, password")
    assert "relaying every" not in result.stdout, result.stdout


def test_a_relay_pass_with_the_bus_down_fails_naming_it(tmp_path: Path) -> None:
    port = closed_port()
    url = f"amqp://guest:{SECRET}@127.0.0.1:{port}//"
    env = {"CELLSIGHT_BUS_URL": url, "CELLSIGHT_PUBLISH_TIMEOUT": "1"}
    data = tmp_path / "d"
    added = cellsight(
        data, "cells", "add", "--name", "c1", "--db-url", f"sqlite:///{tmp_path}/c1.db"
    )
    assert added.returncode == 0, added.stderr
    result = cellsight(data, "outbox", "relay", env=env)
    assert_one_line_error(result, RUNTIME, f"127.0.0.1:{port}", "no connection", "refused")
    assert result.stdout.strip() == "c1: published 0, 0 left"  # its cells' lines first


def test_a_relay_service_waits_for_a_bus_not_up_yet(tmp_path: Path) -> None:
    """A review: a bus down for a moment as the service started ended it (exit 1), and a
    service manager without a restart policy left it dead."""
    port = closed_port()
    url = f"amqp://guest:{SECRET}@127.0.0.1:{port}//"
    env = {**_clean_env(), "CELLSIGHT_BUS_URL": url, "CELLSIGHT_PUBLISH_TIMEOUT": "1"}
    (tmp_path / "d").mkdir()
    argv = [sys.executable, "-m", "cellsight", "--data-dir", str(tmp_path / "d")]
    relay = subprocess.Popen(
        [*argv, "outbox", "relay", "--every", "5"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert relay.stdout is not None
    first = relay.stdout.readline()  # printed once the check is over
    assert first.startswith("relaying every 5 s"), first
    relay.send_signal(signal.SIGTERM)
    _, stderr = relay.communicate(timeout=60)
    assert relay.returncode == 0, stderr
    assert "the bus cannot be reached yet" in stderr and SECRET not in stderr


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CELLSIGHT_")}


@pytest.mark.services
def test_an_empty_relay_declares_the_indexer_queue(tmp_path: Path, rabbitmq_url: str) -> None:
    """The check is the first publish's declarations: notifications published later wait
    in the indexer's queue even if the indexer has never run."""
    name = f"cellsight-check-{uuid.uuid4().hex[:8]}"
    rabbitmq_names(queues=[name, f"{name}-dlq"], exchanges=[f"{name}-x", f"{name}-dlx"])
    env = {
        "CELLSIGHT_BUS_URL": rabbitmq_url,
        "CELLSIGHT_EXCHANGE": f"{name}-x",
        "CELLSIGHT_INDEXER_QUEUE": name,
        "CELLSIGHT_DEAD_LETTER_EXCHANGE": f"{name}-dlx",
        "CELLSIGHT_DEAD_LETTER_QUEUE": f"{name}-dlq",
    }
    result = cellsight(tmp_path / "d", "outbox", "relay", env=env)
    assert result.returncode == 0, (result.stdout, result.stderr)
    with Connection(rabbitmq_url) as conn:
        # Passive: raises NOT_FOUND for a queue nobody declared.
        Queue(name, channel=conn.channel()).queue_declare(passive=True)
