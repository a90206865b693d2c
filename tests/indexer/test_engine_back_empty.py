"""An engine that comes back empty (an in-memory peer restarted, a wiped cluster) does
not stop the indexer: its indexes are made again as at start-up and the stream goes on;
`index sync` restores what the engine lost. On every engine, through both pipelines."""

from __future__ import annotations

from pathlib import Path

import pytest

from cellsight.cells.instances import BootRequest
from cellsight.cells.operations import Operations
from cellsight.clients import build_notifier
from cellsight.indexer.engines.base import RESOURCES, SearchEngine
from cellsight.indexer.index_roles import is_synced
from cellsight.indexer.sync import SyncOptions, run_sync
from tests.support.drift import index_differences
from tests.support.indexing import (
    PIPELINES,
    bus_settings,
    running_indexer,
    sqlite_cluster,
    wait_for,
)
from tests.support.publishers import CountingPublisher

pytestmark = pytest.mark.services


def _boot(ops: Operations, name: str, count: int) -> list[str]:
    made = ops.boot(
        BootRequest(display_name=name, flavor="m1.small", project_id="p1", user_id="u", count=count)
    )
    return [p.uuid for p in made.instances]


def _wipe(engine: SearchEngine) -> None:
    for resource in RESOURCES:
        for info in engine.indexes(resource):
            engine.drop_index(info.name)
        assert engine.indexes(resource) == []


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_the_indexer_makes_lost_indexes_again_and_goes_on(
    rabbitmq_url: str, engine: SearchEngine, tmp_path: Path, pipeline: str
) -> None:
    settings = bus_settings(tmp_path / "data", "rabbitmq")
    registry = sqlite_cluster(settings, hosts=3)
    notifier = build_notifier(settings)
    publisher = CountingPublisher(notifier)
    ops = Operations(registry, publisher, publisher_id="test")
    run_sync(engine, registry, SyncOptions())  # the index serves: marked synced
    assert is_synced(engine, "instance")
    with running_indexer(settings, engine, pipeline) as consumer:
        before = _boot(ops, "before", 4)
        wait_for(lambda: consumer.acked >= publisher.count, what="the first instances indexed")
        _wipe(engine)
        after = _boot(ops, "after", 4)
        ops.power_off(before[0])  # an update of an instance the engine lost
        wait_for(lambda: consumer.acked >= publisher.count, what="indexed after the engine's loss")
        assert consumer.totals["dead"] == 0
        engine.refresh("instance")
        assert all(engine.get("instance", u) is not None for u in [*after, before[0]])
        # What the engine lost and no event since carried is for `index sync` to restore.
        assert [u for u in before[1:] if engine.get("instance", u) is not None] == []
        # The index made again is not the one a sync completed: the API serves by fan-out.
        assert not is_synced(engine, "instance")
        run_sync(engine, registry, SyncOptions())
        assert index_differences(registry, engine) == {}
        assert is_synced(engine, "instance")
    notifier.close()
    registry.close()
