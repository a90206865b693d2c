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


def test_a_process_that_lost_the_race_to_make_the_index_leaves_its_own_unaliased(
    make_world: Any, monkeypatch: Any
) -> None:
    """Two indexer processes starting on an empty cluster (or after a wipe) each make an
    index; the one made later stepped back by dropping its own, and a bulk under way to
    it made the cluster create it again, dynamic and unaliased (a probe, on osmem). It is
    now only unaliased: a late write lands in an index of the strict mapping, and the
    next sync drops it."""
    world: World = make_world("sqlite", "opensearch", cells=1, instances=5)
    engine = world.engine
    assert isinstance(engine, HttpEngine)
    engine.ensure_ready("instance")  # the first process
    (first,) = [info.name for info in engine.indexes("instance")]
    # The second read the aliases before the first made its index: it makes its own.
    monkeypatch.setattr(engine, "_aliases_of", lambda resource: {}, raising=False)
    engine.ensure_ready("instance")
    monkeypatch.undo()
    infos = {info.name: info for info in engine.indexes("instance")}
    (second,) = infos.keys() - {first}
    assert infos[first].read and infos[first].write
    assert not infos[second].read and not infos[second].write
    # A write that resolved the write alias while it spanned both lands in an index of
    # Cellsight's strict mapping, not in a dynamic one the cluster made for it.
    engine._send("PUT", f"/{second}/_doc/late", body={"uuid": "late", "version": 1})
    late = {info.name: info for info in engine.indexes("instance")}[second]
    assert "auto_created" not in late.meta
    assert [info.name for info in layout(engine, "instance").stray] == [second]
    report = run_sync(engine, world.registry, SyncOptions(keep_old=0))
    assert second in report.cleaned_up
