"""Tempest's own compute client validates our server bodies against its own schemas.

``tempest.lib.services.compute.servers_client.ServersClient`` picks the response schema
for the microversion it asks for (its ``schema_versions_info``, the selection Tempest's
API tests use) and validates every ``GET /servers``, ``/servers/detail`` and
``/servers/{id}`` answer. Each microversion where that schema changes (every range
bound up to Cellsight's maximum) is asked, on both paths (index and fan-out), as an
administrator and as a member. The only stand-in is authentication: there is no
Keystone, so a fixed-token auth provider hands Tempest the endpoint and token.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cellsight.api.app import create_app
from cellsight.api.microversion import MAX
from cellsight.api.microversion import parse as parse_version
from cellsight.api.render import NO_TIME
from cellsight.cells.nodeevents import register_node
from cellsight.cells.operations import Operations
from cellsight.cells.reservations import Reservations
from cellsight.indexer.engines.embedded import EmbeddedEngine
from tests.support.api_world import World, api_settings, build_world, load_index, project_tokens
from tests.support.publishers import CollectingPublisher
from tests.support.serve import serving

servers_client = pytest.importorskip("tempest.lib.services.compute.servers_client")
base_compute_client = pytest.importorskip("tempest.lib.services.compute.base_compute_client")
tempest_auth = pytest.importorskip("tempest.lib.auth")
tempest_exceptions = pytest.importorskip("tempest.lib.exceptions")


class FixedToken(tempest_auth.AuthProvider):  # type: ignore[name-defined]
    """A token and an endpoint, no identity service (Cellsight's dev-mode tokens)."""

    def __init__(self, endpoint: str, token: str) -> None:  # no Credentials to check
        self.endpoint = endpoint.rstrip("/")
        self.token = token
        self.cache = None
        self.alt_auth_data = None
        self.alt_part = None
        self._scope = "project"

    def _decorate_request(
        self,
        filters: Any,
        method: str,
        url: str,
        headers: dict[str, str] | None = None,
        body: Any = None,
        auth_data: Any = None,
    ) -> tuple[str, dict[str, str], Any]:
        out = dict(headers or {})
        out["X-Auth-Token"] = self.token
        return f"{self.endpoint}/{url.lstrip('/')}", out, body

    def _get_auth(self) -> tuple[str, dict[str, Any]]:
        return self.token, {}

    def _fill_credentials(self, auth_data_body: Any) -> None:
        return None

    def is_expired(self, auth_data: Any) -> bool:
        return False

    def base_url(self, filters: Any, auth_data: Any = None) -> str:
        return self.endpoint

    def _auth_client(self) -> None:
        return None

    def _auth_params(self) -> dict[str, Any]:
        return {}

    def _get_auth_from_cache(self) -> None:
        return None


def schema_versions() -> list[str]:
    """Every bound of Tempest's server schema ranges that Cellsight serves."""
    out: list[str] = []
    for item in servers_client.ServersClient.schema_versions_info:
        for bound in (item["min"] or "2.1", item["max"]):
            if bound and parse_version(bound) <= MAX and bound not in out:
                out.append(bound)
    return out


VERSIONS = schema_versions()


@pytest.fixture(scope="module")
def endpoints(
    sqlite_world: World, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    with both_paths(tmp_path_factory.mktemp("tempest"), sqlite_world, "tempest") as urls:
        yield urls


@contextmanager
def both_paths(tmp: Path, world: World, prefix: str) -> Iterator[dict[str, str]]:
    """The API over ``world`` twice, served: from a loaded index and (its index empty,
    unsynced) from the cells; their base URLs by path."""
    indexed = EmbeddedEngine(tmp / "index.db", prefix=prefix)
    load_index(indexed, world)
    empty = EmbeddedEngine(tmp / "empty.db", prefix=f"{prefix}_empty")
    index_app = create_app(api_settings(tmp / "i"), engine=indexed, registry=world.registry)
    fanout_app = create_app(api_settings(tmp / "f"), engine=empty, registry=world.registry)
    try:
        with serving(index_app) as index_url, serving(fanout_app) as fanout_url:
            yield {"index": index_url, "fanout": fanout_url}
    finally:
        indexed.close()
        empty.close()


def client(base: str, token: str) -> Any:
    return servers_client.ServersClient(FixedToken(f"{base}/v2.1", token), "compute", "local")


def test_the_versions_cover_every_schema_change() -> None:
    assert VERSIONS[0] == "2.1" and "2.71" in VERSIONS and "2.96" in VERSIONS
    assert len(VERSIONS) >= 40


@pytest.mark.parametrize("path", ["index", "fanout"])
@pytest.mark.parametrize("role", ["admin", "member"])
def test_bodies_validate_against_tempest_schemas(
    endpoints: dict[str, str],
    sqlite_world: World,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    role: str,
) -> None:
    token = "root:admin" if role == "admin" else project_tokens(sqlite_world)[0]["X-Auth-Token"]
    tempest = client(endpoints[path], token)
    checked = 0
    for version in VERSIONS:
        # Tempest's own switch: the client sends and validates this microversion.
        monkeypatch.setattr(base_compute_client, "COMPUTE_MICROVERSION", version)
        params: dict[str, Any] = {"limit": 25}
        if role == "admin":
            params["all_tenants"] = "True"
        listed = tempest.list_servers(detail=False, **params)
        assert listed.response["x-cellsight-path"] == path
        assert listed["servers"], version
        detailed = tempest.list_servers(detail=True, **params)
        assert [s["id"] for s in detailed["servers"]] == [s["id"] for s in listed["servers"]]
        for server in detailed["servers"][:3]:
            shown = tempest.show_server(server["id"])["server"]
            assert shown["id"] == server["id"]
            if parse_version(version) >= parse_version("2.71"):
                assert shown["server_groups"] == []
            if role == "admin":
                assert isinstance(shown["OS-EXT-SRV-ATTR:instance_name"], str)
                assert shown["OS-EXT-SRV-ATTR:instance_name"]
            else:
                assert "OS-EXT-SRV-ATTR:instance_name" not in shown
        checked += 1
    assert checked == len(VERSIONS)


def test_a_bad_body_is_caught(endpoints: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The validation is live: a body breaking the 2.3 schema fails Tempest's check."""
    from tempest.lib.api_schema.response.compute.v2_3 import servers as v23

    monkeypatch.setattr(base_compute_client, "COMPUTE_MICROVERSION", "2.3")
    tempest = client(endpoints["index"], "root:admin")
    body = tempest.list_servers(detail=True, all_tenants="True", limit=1)
    broken = {"servers": [dict(body["servers"][0], **{"OS-EXT-SRV-ATTR:launch_index": None})]}
    with pytest.raises(tempest_exceptions.InvalidHTTPResponseBody):
        tempest.validate_response(v23.list_servers_detail, body.response, broken)


@pytest.fixture(scope="module")
def reservations_endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A world holding reservations as the workflow leaves them: one without a name or a
    flavor, one named only when it was modified and then committed, one reserved whole."""
    tmp: Path = tmp_path_factory.mktemp("tempest-reservations")
    world = build_world(tmp / "world", "sqlite")
    cell = world.registry.list_cells()[0]
    ops = Operations(world.registry, CollectingPublisher(), publisher_id="tempest")
    register_node(ops, cell.name, "tempest-h1", vcpus=64, memory_mb=1 << 20, local_gb=10_000)
    reservations = Reservations(ops)
    bare = reservations.reserve(cell=cell.name).uuid
    late = reservations.reserve(flavor="m1.small", cell=cell.name).uuid
    reservations.modify(late, name="late name", project_id="p7", user_id="u7")
    reservations.commit(late)
    whole = reservations.reserve(
        flavor="m1.small", name="whole", project_id="p7", user_id="u7", cell=cell.name
    ).uuid
    with both_paths(tmp, world, "tempest_r") as urls:
        yield {**urls, "uuids": [bare, late, whole]}
    world.registry.close()


@pytest.mark.parametrize("path", ["index", "fanout"])
@pytest.mark.parametrize("role", ["admin", "member"])
def test_reservations_and_what_they_became_validate_against_tempest_schemas(
    reservations_endpoints: dict[str, Any], monkeypatch: pytest.MonkeyPatch, path: str, role: str
) -> None:
    # Found from outside: a reservation without a name or a flavor, and one named after it
    # was reserved, had a null hostname and null flavor amounts, which Tempest refuses.
    bare, late, whole = reservations_endpoints["uuids"]
    tempest = client(reservations_endpoints[path], "root:admin" if role == "admin" else "u7:p7")
    scope = {"all_tenants": "True"} if role == "admin" else {}
    for version in VERSIONS:
        monkeypatch.setattr(base_compute_client, "COMPUTE_MICROVERSION", version)
        listed = tempest.list_servers(detail=True, limit=1000, **scope)
        assert listed.response["x-cellsight-path"] == path
        assert late in {s["id"] for s in listed["servers"]}
        forthcoming = tempest.list_servers(detail=True, forthcoming="true", **scope)
        seen = {s["id"] for s in forthcoming["servers"]}
        assert whole in seen and (bare in seen) == (role == "admin"), version
        for uuid in (late, whole, *([bare] if role == "admin" else [])):
            assert tempest.show_server(uuid)["server"]["id"] == uuid
        if role == "admin" and parse_version(version) >= parse_version("2.3"):
            shown = tempest.show_server(late)["server"]
            assert shown["OS-EXT-SRV-ATTR:hostname"] == "late-name"


def test_a_row_without_times_validates_on_both_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An adversarial probe nulled a row's created_at and updated_at with plain SQL: both
    paths rendered ``"created": null``, which Tempest's schemas refuse at every version.
    Both now show the epoch, the same on every page and either path."""
    world = build_world(tmp_path / "w", "sqlite")
    victim = world.listed_server()
    world.set_row(victim, created_at=None, updated_at=None)
    with both_paths(tmp_path / "p", world, "notimes") as urls:
        for version in ("2.1", "2.47", "2.96"):
            monkeypatch.setattr(base_compute_client, "COMPUTE_MICROVERSION", version)
            for path, base in urls.items():
                tempest = client(base, "root:admin")
                server = tempest.show_server(victim)["server"]
                assert (server["created"], server["updated"]) == (NO_TIME, NO_TIME)
                listed = tempest.list_servers(detail=True, all_tenants="True", limit=1000)
                assert listed.response["x-cellsight-path"] == path
                (found,) = [s for s in listed["servers"] if s["id"] == victim]
                assert (found["created"], found["updated"]) == (NO_TIME, NO_TIME)
    world.registry.close()
