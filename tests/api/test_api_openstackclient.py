"""``openstack server list`` (python-openstackclient, the OpenStack CLI itself) against
the app served by uvicorn, as an administrator and as a member, on both paths.

No Keystone: ``clouds.yaml`` uses keystoneauth's ``admin_token`` plugin (a fixed
token, Cellsight's dev-mode ``user:project``) and ``compute_endpoint_override``. The
CLI insists on discovering an identity v3 endpoint before listing, so a stand-in
serves only the identity version document (the one part that cannot exist here).
The CLI sends its own request shape: ``deleted=False`` always, ``all_tenants``,
``host``… and microversion 2.96.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request

from cellsight.api.app import create_app
from cellsight.indexer.engines.embedded import EmbeddedEngine
from tests.support.api_world import World, api_settings, load_index, project_tokens
from tests.support.serve import serving

pytest.importorskip("openstackclient")
IDENTITY_V3 = "application/vnd.openstack.identity-v3+json"
OPENSTACK = Path(sys.executable).with_name("openstack")


def identity_discovery() -> FastAPI:
    app = FastAPI()

    @app.get("/identity/v3")
    def version(request: Request) -> dict[str, Any]:
        return {
            "version": {
                "id": "v3.14",
                "status": "stable",
                "updated": "2020-04-07T00:00:00Z",
                "links": [{"rel": "self", "href": f"{request.base_url}identity/v3/"}],
                "media-types": [{"base": "application/json", "type": IDENTITY_V3}],
            }
        }

    return app


@pytest.fixture(scope="module")
def urls(sqlite_world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("osc")
    indexed = EmbeddedEngine(tmp / "index.db", prefix="osc")
    load_index(indexed, sqlite_world)
    empty = EmbeddedEngine(tmp / "empty.db", prefix="osc_empty")
    index_app = create_app(api_settings(tmp / "i"), engine=indexed, registry=sqlite_world.registry)
    fanout_app = create_app(api_settings(tmp / "f"), engine=empty, registry=sqlite_world.registry)
    with (
        serving(index_app) as index_url,
        serving(fanout_app) as fanout_url,
        serving(identity_discovery()) as identity_url,
    ):
        yield {"index": index_url, "fanout": fanout_url, "identity": identity_url}
    indexed.close()
    empty.close()


def openstack(tmp: Path, urls: dict[str, str], path: str, token: str, *args: str) -> Any:
    clouds = tmp / "clouds.yaml"
    clouds.write_text(
        "clouds:\n"
        "  cellsight:\n"
        "    auth_type: admin_token\n"
        f"    auth: {{token: '{token}', endpoint: '{urls[path]}/v2.1'}}\n"
        f"    compute_endpoint_override: '{urls[path]}/v2.1'\n"
        f"    identity_endpoint_override: '{urls['identity']}/identity/v3'\n"
        "    identity_api_version: 3\n"
        "    region_name: local\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OS_")}
    env["OS_CLIENT_CONFIG_FILE"] = str(clouds)
    done = subprocess.run(
        [str(OPENSTACK), "--os-cloud", "cellsight", "server", "list", "-f", "json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def live_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if not (r["deleted"] or r["forthcoming"])]


@pytest.mark.parametrize("path", ["index", "fanout"])
def test_server_list_as_admin_and_member(
    urls: dict[str, str], sqlite_world: World, tmp_path: Path, path: str
) -> None:
    rows = [r for _, r in sqlite_world.rows()]
    # Reservations (forthcoming) are listed only when asked for: never to Nova's clients.
    live = {r["uuid"] for r in live_rows(rows)}
    everyone = openstack(tmp_path, urls, path, "root:admin", "--all-projects", "--limit", "1000")
    assert {s["ID"] for s in everyone} == live

    token = project_tokens(sqlite_world)[0]["X-Auth-Token"]
    project = token.split(":")[1]
    mine = {r["uuid"] for r in live_rows(rows) if r["project_id"] == project}
    listed = openstack(tmp_path, urls, path, token)
    assert {s["ID"] for s in listed} == mine
    # Options a member may not use are dropped, as Nova drops them: same listing.
    dropped = openstack(tmp_path, urls, path, token, "--host", "nowhere", "--deleted")
    assert {s["ID"] for s in dropped} == mine


def test_a_member_asking_for_all_projects_is_refused(
    urls: dict[str, str], sqlite_world: World, tmp_path: Path
) -> None:
    token = project_tokens(sqlite_world)[0]["X-Auth-Token"]
    clouds_args = ("--all-projects",)
    with pytest.raises(AssertionError, match=r"403|Policy"):
        openstack(tmp_path, urls, "fanout", token, *clouds_args)
