"""``dlq replay`` while the indexer runs and the letters are still bad: each letter is
replayed once and the replay ends. An adversarial probe found it read the queue until
empty, so the letters the running indexer dead-lettered again were replayed again, for
ever (``--limit N`` counted the same letters several times)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cellsight.clients import build_bus
from cellsight.indexer.dlq import peek, replay
from cellsight.indexer.engines.embedded import EmbeddedEngine
from tests.support.indexing import bus_settings, publish_bodies, running_indexer, wait_for

LETTERS = 30


@pytest.mark.parametrize("bus", ["rabbitmq", "embedded"])
def test_a_replay_beside_the_indexer_replays_each_letter_once_and_ends(
    bus: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if bus == "rabbitmq":
        request.getfixturevalue("rabbitmq_url")  # skipped, or failed, without RabbitMQ
    settings = bus_settings(tmp_path / "data", bus)
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    publish_bodies(settings, [f"not json {i}".encode() for i in range(LETTERS)])
    with running_indexer(settings, engine) as consumer:
        wait_for(lambda: consumer.totals["dead"] == LETTERS, 60, "the first dead letters")
        with build_bus(settings) as b, b.connection() as conn:
            replayed, skipped, _ = replay(
                conn,
                exchange_name=settings.exchange,
                dlx_name=settings.dead_letter_exchange,
                dlq_name=settings.dead_letter_queue,
            )
            assert (replayed, skipped) == (LETTERS, 0)
            # Replayed, still bad: dead-lettered once more each, and the queue holds them.
            wait_for(lambda: consumer.totals["dead"] == 2 * LETTERS, 60, "the letters again")
            letters = peek(conn, settings.dead_letter_exchange, settings.dead_letter_queue, 100)
            assert sorted(letter.body for letter in letters) == sorted(
                f"not json {i}".encode() for i in range(LETTERS)
            )
            limited, *_ = replay(
                conn,
                exchange_name=settings.exchange,
                dlx_name=settings.dead_letter_exchange,
                dlq_name=settings.dead_letter_queue,
                limit=10 * LETTERS,
            )
            assert limited == LETTERS  # at most the letters there were, each once
    engine.close()


@pytest.mark.parametrize("bus", ["rabbitmq", "embedded"])
def test_an_interrupted_replay_says_how_many_it_replayed_and_keeps_the_rest(
    bus: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """Ctrl-C (or SIGTERM, which the command turns into one) between two republishes:
    the command said only ``interrupted``; the letter being republished and the rest stay
    in the DLQ, on either bus."""
    from cellsight.indexer import dlq

    if bus == "rabbitmq":
        request.getfixturevalue("rabbitmq_url")  # skipped, or failed, without RabbitMQ
    settings = bus_settings(tmp_path / "data", bus)
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    publish_bodies(settings, [f"not json {i}".encode() for i in range(LETTERS)])
    with running_indexer(settings, engine) as consumer:
        wait_for(lambda: consumer.totals["dead"] == LETTERS, 60, "the dead letters")
    engine.close()
    publish, calls = dlq.publish_confirmed, [0]

    def interrupted_at_the_sixth(*args: object, **kwargs: object) -> None:
        calls[0] += 1
        if calls[0] == 6:
            raise KeyboardInterrupt
        publish(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(dlq, "publish_confirmed", interrupted_at_the_sixth)
    with (
        build_bus(settings) as b,
        b.connection() as conn,
        pytest.raises(dlq.ReplayInterrupted, match="after replaying 5 letter"),
    ):
        replay(
            conn,
            exchange_name=settings.exchange,
            dlx_name=settings.dead_letter_exchange,
            dlq_name=settings.dead_letter_queue,
        )
    monkeypatch.undo()
    with build_bus(settings) as b, b.connection() as conn:
        left = list(peek(conn, settings.dead_letter_exchange, settings.dead_letter_queue, 100))
    assert len(left) == LETTERS - 5


def test_a_limited_replay_says_how_many_letters_it_left(tmp_path: Path) -> None:
    """An operator probe: ``dlq replay --limit 2`` printed "left 0" with more letters
    behind the limit; what it left is counted, with why."""
    from typer.testing import CliRunner

    from cellsight.cli import app
    from tests.indexer.test_dead_letters import _env

    settings = bus_settings(tmp_path / "data", "embedded")
    engine = EmbeddedEngine(tmp_path / "index.db")
    engine.ensure_ready("instance")
    publish_bodies(settings, [f"not json {i}".encode() for i in range(5)])
    with running_indexer(settings, engine) as consumer:
        wait_for(lambda: consumer.totals["dead"] == 5, 60, "the dead letters")
    engine.close()
    argv = ["--data-dir", str(settings.data_dir), "dlq", "replay"]
    runner = CliRunner()
    limited = runner.invoke(app, [*argv, "--limit", "2"], env=_env(settings))
    assert limited.exit_code == 0, limited.output
    assert limited.output.strip() == "replayed 2, left 3 (3 past --limit)"
    other = runner.invoke(app, [*argv, "--reason", "too_large"], env=_env(settings))
    assert other.output.strip() == "replayed 0, left 3 (3 with another reason)"
    rest = runner.invoke(app, [*argv, "--reason", "malformed"], env=_env(settings))
    assert rest.output.strip() == "replayed 3, left 0"
