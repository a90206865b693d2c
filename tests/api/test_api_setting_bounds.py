"""Durations the API waits on are finite and bounded when the settings are built: before,
``cell_timeout=1e10`` made every fan-out listing a 500 (its wait overflowed), and
``index_probe_interval=inf`` killed the prober thread and made ``/readyz`` a 500 (inf
is no JSON). A control character in ``X-Auth-Token`` is a 400 naming the header."""

from __future__ import annotations

from pathlib import Path

import pytest

from cellsight.settings import MAX_SECONDS, ConfigError
from tests.support.api_world import ADMIN, World, api_settings, make_client


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("cell_timeout", 1e10),
        ("cell_timeout", float("inf")),
        ("index_probe_interval", float("inf")),
        ("node_cache_refresh", float("inf")),
        ("fanout_admission_wait", float("nan")),
        ("fanout_workers", 10**9),
        ("max_limit", 10**30),
    ],
)
def test_an_unbounded_setting_is_refused_when_the_settings_are_built(
    tmp_path: Path, setting: str, value: float
) -> None:
    with pytest.raises(ConfigError, match=rf"^invalid setting {setting} \(CELLSIGHT_"):
        api_settings(tmp_path, **{setting: value})


def test_the_longest_durations_still_serve(sqlite_world: World, tmp_path: Path) -> None:
    longest = make_client(
        tmp_path, sqlite_world, cell_timeout=MAX_SECONDS, index_probe_interval=MAX_SECONDS
    )
    with longest as client:
        listing = client.get("/v2.1/servers?all_tenants=1&limit=2", headers=ADMIN)
        assert listing.status_code == 200, listing.text
        assert len(listing.json()["servers"]) == 2
        ready = client.get("/readyz")
        assert ready.status_code in (200, 503), ready.text
        assert ready.json()["index"]["probe"] is not None


@pytest.mark.parametrize(
    "token", ["a:b\x00", "a:\x01b", "a\x7f:b", "a:b\x85c", "a:b\x1f", "\x1ca:b", "a:b\x0b"]
)
def test_a_control_character_in_the_token_is_400_naming_the_header(
    sqlite_world: World, tmp_path: Path, token: str
) -> None:
    with make_client(tmp_path, sqlite_world) as client:
        for path in ("/v2.1/servers", "/v2.1/servers/detail", "/v2.1/query/instance/fields"):
            response = client.get(path, headers={"X-Auth-Token": token.encode("latin-1")})
            assert response.status_code == 400, (path, response.text)
            assert "X-Auth-Token" in response.json()["badRequest"]["message"]
