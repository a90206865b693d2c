"""OpenStack's own client, python-novaclient, against the app served by uvicorn.

Authentication is keystoneauth's ``token_endpoint.Token``: a fixed token and endpoint,
no Keystone catalog (the ``X-Auth-Token`` is Cellsight's development-mode
``user:project``). The client is a declared ``test`` dependency: never skipped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from keystoneauth1 import session as ks_session
from keystoneauth1 import token_endpoint
from novaclient import client as novaclient

from cellsight.api.app import create_app
from tests.support.api_world import World, api_settings


@pytest.fixture(scope="module")
def served(sqlite_world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("nova")
    app = create_app(api_settings(tmp), registry=sqlite_world.registry)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]  # bound by the OS: never taken
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def nova(base: str, token: str, version: str = "2.1") -> Any:
    auth = token_endpoint.Token(endpoint=f"{base}/v2.1", token=token)
    return novaclient.Client(version, session=ks_session.Session(auth=auth))


def test_list_detailed_with_filters_limit_and_marker(served: str, sqlite_world: World) -> None:
    client = nova(served, "root:admin")
    opts = {"all_tenants": 1, "status": "ACTIVE"}
    first = client.servers.list(detailed=True, search_opts=opts, limit=5)
    assert len(first) == 5 and all(s.status == "ACTIVE" for s in first)
    second = client.servers.list(detailed=True, search_opts=opts, limit=5, marker=first[-1].id)
    assert not {s.id for s in first} & {s.id for s in second}
    everything = client.servers.list(detailed=True, search_opts=opts, limit=-1)  # pages by marker
    assert [s.id for s in everything][:10] == [s.id for s in first + second]
    live = {r["uuid"] for _, r in sqlite_world.rows() if not r["deleted"]}
    assert {s.id for s in everything} <= live
    server = client.servers.get(first[0].id)
    assert server.id == first[0].id and server.name == first[0].name
    assert getattr(server, "OS-EXT-STS:vm_state") == "active"


def test_member_and_newer_microversion(served: str, sqlite_world: World) -> None:
    rows = [r for _, r in sqlite_world.rows() if not r["deleted"]]
    project = rows[0]["project_id"]
    client = nova(served, f"someone:{project}", "2.96")
    mine = client.servers.list(detailed=True)
    assert mine and {s.tenant_id for s in mine} == {project}
    assert all(isinstance(s.flavor, dict) and "original_name" in s.flavor for s in mine)
    names = client.servers.list(
        detailed=False, search_opts={"name": "^" + (mine[0].name or "")[:3]}
    )
    assert mine[0].id in {s.id for s in names} or not mine[0].name
