"""An index named as a sync names its new index but made by the cluster's automatic
index creation (a live write racing a sync's drop of a killed sync's index): a dynamic
mapping and no record of Cellsight's. A probe found one on osmem that ``index status``
never showed and that outlived ten syncs; it is listed now, and dropped as a stray."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from cellsight.indexer.engines.http import HttpEngine
from cellsight.indexer.index_roles import layout
from cellsight.indexer.sync import SyncOptions, run_sync
from tests.support.sync_world import World


def test_an_auto_created_index_is_listed_and_cleaned_up(make_world: Any) -> None:
    world: World = make_world("sqlite", "opensearch", cells=1, instances=5)
    engine = world.engine
    assert isinstance(engine, HttpEngine)
    run_sync(engine, world.registry, SyncOptions(keep_old=0))
    serving = layout(engine, "instance").serving
    assert serving is not None
    later = datetime.now(UTC) + timedelta(seconds=1)
    name = f"{engine.prefix}-instance-{later:%Y%m%d%H%M%S%f}"
    # A document written to the name: the cluster makes the index, as a live write did.
    engine._send("PUT", f"/{name}/_doc/stray", body={"uuid": "stray", "version": 1})
    listed = {info.name: info for info in engine.indexes("instance")}
    assert name in listed and listed[name].meta.get("auto_created") is True
    assert [info.name for info in layout(engine, "instance").stray] == [name]
    report = run_sync(engine, world.registry, SyncOptions(keep_old=0))
    assert name in report.cleaned_up
    assert name not in {info.name for info in engine.indexes("instance")}
    # And a name of another shape under the prefix is left alone.
    other = f"{engine.prefix}-instance-notastamp"
    engine._send("PUT", f"/{other}/_doc/x", body={"uuid": "x"})
    assert other not in {info.name for info in engine.indexes("instance")}
