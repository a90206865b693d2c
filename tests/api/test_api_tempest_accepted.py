"""What the contract accepts at its edges, indexed by the indexer's own planning and
served by the index path, passes Tempest's server schemas at every microversion where
they change: addresses of every form (the version told by the address, whatever the
payload says), tags of 60 characters and non-ASCII ones, fifty of them. What it
refuses (``tests/notifications/test_forms.py``) never reaches the index."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cellsight.api.app import create_app
from cellsight.api.microversion import MAX
from cellsight.api.microversion import parse as parse_version
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.index_roles import marker_key
from cellsight.indexer.planning import plan
from cellsight.settings import load_settings
from tests.support import novagen, poison
from tests.support.indexing import sqlite_cluster

servers_client = pytest.importorskip("tempest.lib.services.compute.servers_client")
rest_client = pytest.importorskip("tempest.lib.common.rest_client")

Change = Callable[[dict[str, Any]], Any]


def _ips(*pairs: tuple[str, int | None]) -> Change:
    def change(data: dict[str, Any]) -> None:
        template = data["ip_addresses"][0]
        data["ip_addresses"] = []
        for address, version in pairs:
            ip = copy.deepcopy(template)
            ip["nova_object.data"].update(address=address, version=version)
            data["ip_addresses"].append(ip)

    return change


EDGES: dict[str, Change] = {
    "ip_version_99": _ips(("10.0.0.1", 99)),
    "ip_version_contradicts": _ips(("10.0.0.2", 6), ("fd00::2", 4)),
    "ip_version_null": _ips(("10.0.0.3", None), ("fd00::3", None)),
    "ip_unspecified": _ips(("0.0.0.0", 4), ("::", 6)),
    "ip_mapped_and_exploded": _ips(
        ("::ffff:10.0.0.4", 6), ("FD00:0000:0000:0000:0000:0000:0000:0004", 6)
    ),
    "no_address": _ips(),
    "tag_60": lambda d: d.update(tags=["t" * 60, "é" * 60, "\U0001f600" * 60]),
    "tags_50": lambda d: d.update(tags=[f"tag-{i}" for i in range(50)]),
    "tag_odd_characters": lambda d: d.update(tags=[" ", "a b", "a:b", "\\", "\x00"]),
    "tags_empty": lambda d: d.update(tags=[]),
}


def _versions() -> list[tuple[str, Any]]:
    out = []
    for item in servers_client.ServersClient.schema_versions_info:
        for bound in (item["min"] or "2.1", item["max"]):
            if bound and parse_version(bound) <= MAX:
                out.append((bound, item["schema"]))
    return out


class _Response(dict[str, str]):
    status = 200


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestClient, dict[str, str]]:
    tmp: Path = tmp_path_factory.mktemp("accepted")
    settings = load_settings(data_dir=tmp / "data")
    registry = sqlite_cluster(settings)
    cell = registry.list_cells()[0]
    bodies, names = [], {}
    for i, (name, change) in enumerate(EDGES.items()):
        body = copy.deepcopy(poison.good(200 + i, "instance.update"))
        data = poison.data(body)
        data.update(uuid=str(uuid.UUID(int=200 + i)), cell_uuid=cell.uuid, revision=1)
        change(data)
        bodies.append(novagen.body(body))
        names[data["uuid"]] = name
    outcomes, planned = plan(bodies)
    assert outcomes == [None] * len(bodies), outcomes  # every edge is accepted
    engine = EmbeddedEngine(tmp / "index.db", prefix="acc")
    engine.ensure_ready("instance")
    engine.bulk([p.op for p in planned])
    engine.refresh("instance")
    (serving,) = [x.name for x in engine.indexes("instance") if x.read]
    engine.put_meta(marker_key("instance"), {"resource": "instance", "index": serving})
    client = TestClient(create_app(settings, engine=engine, registry=registry))
    return client, names


@pytest.mark.parametrize(("version", "schema"), _versions(), ids=lambda v: str(v)[:8])
def test_accepted_edges_validate_against_tempest_schemas(
    served: tuple[TestClient, dict[str, str]], version: str, schema: Any
) -> None:
    client, names = served
    headers = {"X-Auth-Token": "root:admin", "OpenStack-API-Version": f"compute {version}"}
    r = client.get("/v2.1/servers/detail?all_tenants=1", headers=headers)
    assert r.status_code == 200 and r.headers["x-cellsight-path"] == "index"
    servers = r.json()["servers"]
    assert {s["id"] for s in servers} == set(names)
    # One at a time: a failure names its edge. (``/servers/{id}`` renders the same body
    # but looks the uuid up through a mapping, which these notifications never made.)
    for server in servers:
        try:
            rest_client.RestClient.validate_response(
                schema.list_servers_detail, _Response(), {"servers": [server]}
            )
        except Exception as exc:
            raise AssertionError(f"{names[server['id']]} at {version}: {exc}") from None
        for shown in server["addresses"].values():
            for address in shown:
                assert address["version"] == (6 if ":" in address["addr"] else 4)
