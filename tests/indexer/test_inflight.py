"""Several writes in flight end in the same index as one batch after another: any
stream (repeated instances, out-of-order versions, tag-less action payloads, poison
bytes) cut into any batches, written three at a time, settles in launch order with the
same verdicts and leaves the same documents as the sequential writer."""

from __future__ import annotations

import itertools
import json
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cellsight.indexer.documents import comparable
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.inflight import Flights, PlannedBatch
from cellsight.indexer.writer import BatchWriter, Outcome
from tests.support import novagen

UUIDS = [f"00000000-0000-4000-8000-{i:012d}" for i in range(3)]
BASE = datetime(2031, 12, 31, 23, 59, 50, tzinfo=UTC)  # crosses a year end

event = st.one_of(
    st.tuples(
        st.just("update"),
        st.sampled_from(UUIDS),
        st.integers(0, 20),
        st.lists(st.sampled_from(["a", "b", "c"]), max_size=2, unique=True),
    ),
    st.tuples(st.just("power_off"), st.sampled_from(UUIDS), st.integers(0, 20), st.none()),
    st.tuples(st.just("poison"), st.binary(max_size=64), st.none(), st.none()),
)


def _body(kind: str, key: Any, second: int | None, tags: list[str] | None) -> bytes:
    if kind == "poison":
        return b"\xff" + bytes(key)  # never valid UTF-8 JSON
    event_type = "instance.update" if kind == "update" else "instance.power_off.end"
    sample = novagen.notification(event_type, seed=0)
    data = sample["payload"]["nova_object.data"]
    data["uuid"] = key
    data["updated_at"] = (BASE + timedelta(seconds=second or 0)).isoformat()
    if tags is not None:
        data["tags"] = tags
    return json.dumps(sample).encode()


def _cut(items: Sequence[bytes], cuts: list[int]) -> list[list[bytes]]:
    points = sorted({c % (len(items) + 1) for c in cuts} | {0, len(items)})
    return [list(items[a:b]) for a, b in itertools.pairwise(points) if b > a]


def _engine(root: Path, name: str) -> EmbeddedEngine:
    engine = EmbeddedEngine(root / f"{name}.db")
    engine.ensure_ready("instance")
    return engine


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(event, min_size=1, max_size=40), cuts=st.lists(st.integers(0, 40)))
def test_three_in_flight_equal_one_after_another(
    events: list[tuple[str, Any, int | None, list[str] | None]], cuts: list[int]
) -> None:
    batches = _cut([_body(*e) for e in events], cuts)
    with tempfile.TemporaryDirectory() as tmp:
        sequential, pipelined = _engine(Path(tmp), "seq"), _engine(Path(tmp), "pipe")
        expected = [BatchWriter(sequential).write(b) for b in batches]

        writer = BatchWriter(pipelined, max_backoff=0.2)
        flights = Flights(writer, limit=3)
        settled: list[tuple[list[int], list[Outcome]]] = []
        try:
            for i, bodies in enumerate(batches):
                batch = PlannedBatch([i] * len(bodies), *writer.plan(bodies))  # type: ignore[list-item]
                while not flights.can_take(batch):
                    flights.wait_oldest(5.0)
                    settled += [(f.messages, o) for f, o in flights.settled()]  # type: ignore[misc]
                flights.launch(batch)
            while len(flights):
                flights.wait_oldest(5.0)
                settled += [(f.messages, o) for f, o in flights.settled()]  # type: ignore[misc]
        finally:
            flights.close()

        assert [m[0] for m, _ in settled] == list(range(len(batches)))  # launch order
        assert [o for _, o in settled] == expected  # the same verdicts, message by message
        for uuid in UUIDS:
            want, got = sequential.get("instance", uuid), pipelined.get("instance", uuid)
            assert (want is None) == (got is None)
            if want is not None and got is not None:
                assert got.version == want.version
                assert comparable(got.document) == comparable(want.document)
        sequential.close()
        pipelined.close()
