"""Times at the ends of the calendar in query v2 (an adversarial probe): a value within
30 µs of the end of year 9999 was sent as 253402300800.0, which is year 10000 (a
double's step there is 2^-14 s): ``cellsight query`` died on it with an internal error,
and the API's own filters refused the number it had sent."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from cellsight.api.headers import PATH
from cellsight.api.query2.rows import epoch_seconds
from cellsight.api.query2.sexpr import parse_filter
from cellsight.cli.query_cmd import format_value
from tests.support.api_world import build_world
from tests.support.query2_world import make_pair, query

TIMESTAMP = {"name": "updated_at", "kind": "timestamp"}
CALENDAR = st.datetimes(
    min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59, 999999)
)


@settings(max_examples=300, deadline=None)
@given(when=CALENDAR | st.sampled_from([datetime.min, datetime.max]))
def test_every_time_is_sent_as_a_number_the_filters_and_the_cli_take_back(when: datetime) -> None:
    seconds = epoch_seconds(when.replace(tzinfo=UTC))
    back = datetime.fromtimestamp(seconds, UTC)
    assert abs((back - when.replace(tzinfo=UTC)).total_seconds()) < 0.001
    parse_filter("instance", [">=", "updated_at", seconds])  # taken, not a 400
    assert format_value(TIMESTAMP, 0, seconds, "h") == back.strftime("%Y-%m-%d %H:%M:%S")


@given(value=st.floats() | st.integers(min_value=-(10**30), max_value=10**30))
def test_the_cli_shows_a_number_past_the_calendar_as_it_came(value: float) -> None:
    shown = format_value(TIMESTAMP, 0, value, "h")  # another server's: never an error
    assert shown and isinstance(shown, str)


def test_the_last_microsecond_of_9999_on_both_paths(tmp_path: Path) -> None:
    world = build_world(tmp_path / "w", "sqlite")
    victim = next(row["uuid"] for _, row in world.rows() if not row["deleted"])
    world.set_row(victim, updated_at=datetime(9999, 12, 31, 23, 59, 59, 999999))
    pair = make_pair(tmp_path, world)
    try:
        answers = []
        for client, path in ((pair.index, "index"), (pair.fanout, "fanout")):
            body = {"fields": ["uuid", "updated_at"], "filter": ["==", "uuid", victim]}
            response = query(client, "instance", body)
            assert response.status_code == 200, response.text
            assert response.headers[PATH] in (path, "lookup")
            ((_, uuid), (status, seconds)) = response.json()["data"][0]
            assert uuid == victim and status == 0
            assert datetime.fromtimestamp(seconds, UTC).year == 9999
            again = query(
                client, "instance", {"fields": ["uuid"], "filter": [">=", "updated_at", seconds]}
            )
            assert again.status_code == 200, again.text
            assert [victim] == [row[0][1] for row in again.json()["data"]]
            answers.append(response.json())
        assert answers[0] == answers[1]
    finally:
        pair.close()
        world.close()
