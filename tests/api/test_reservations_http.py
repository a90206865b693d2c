"""Reservations over HTTP: reserve → modify → rename → commit and reserve → cancel end
with the cells, the index (fed only the notifications) and both API paths agreeing;
plain listings never show a reservation; uuid-only ones answer status 3 in query v2."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cellsight.api.headers import PATH
from cellsight.api.routes import reservations as reservations_routes
from cellsight.cells.instances import BootRequest
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.nodes import add_compute_node
from cellsight.cells.operations import Operations
from cellsight.cells.outbox import Outbox
from cellsight.cells.relay_loop import relay_cells
from cellsight.indexer.engines.embedded import EmbeddedEngine
from cellsight.indexer.index_roles import marker_key
from cellsight.indexer.writer import BatchWriter
from tests.support.api_world import World, make_client
from tests.support.publishers import CollectingPublisher, FailingPublisher
from tests.support.query2_world import ADMIN, query, state

MEMBER = {"X-Auth-Token": "alice:p"}
NODE: dict[str, Any] = {
    "vcpus": 8,
    "memory_mb": 32768,
    "local_gb": 400,
    "cpu_allocation_ratio": 1.0,
}


class Stack:
    def __init__(self, tmp: Path) -> None:
        registry = CellRegistry(f"sqlite:///{tmp / 'api.db'}")
        registry.create_schema()
        for name in ("cell1", "cell2"):
            cell = registry.add_cell(name, f"sqlite:///{tmp / name}.db")
            for host in ("h1", "h2"):
                add_compute_node(registry.cell_engine(cell), f"{name}-{host}", **NODE)
        self.world = World(registry, "sqlite")
        self.engine = EmbeddedEngine(tmp / "index.db", prefix="res")
        for resource in ("instance", "node"):
            self.engine.ensure_ready(resource)
        (serving,) = [i.name for i in self.engine.indexes("instance") if i.read]
        self.engine.put_meta(marker_key("instance"), {"resource": "instance", "index": serving})
        self.publisher = CollectingPublisher()
        self.index = make_client(tmp / "i", self.world, self.engine)
        self.fanout = make_client(tmp / "f", self.world)
        for client in (self.index, self.fanout):
            state(client).publisher = self.publisher
        self.writer = BatchWriter(self.engine)

    def deliver(self) -> None:
        bodies = [json.dumps(n.to_oslo()).encode() for n in self.publisher.take()]
        outcomes = self.writer.write(bodies)
        assert all(o.verdict.value in ("indexed", "stale") for o in outcomes), outcomes

    def agree(self) -> dict[str, dict[str, Any]]:
        """Both paths list the cells' live reservations alike; returns them by uuid."""
        self.deliver()
        rows = [r for _, r in self.world.rows()]
        want = {r["uuid"] for r in rows if r["forthcoming"] and not r["deleted"]}
        bodies = {}
        for client, path in ((self.index, "index"), (self.fanout, "fanout")):
            got = client.get("/v2.1/servers/detail?forthcoming=true&all_tenants=1", headers=ADMIN)
            assert got.status_code == 200 and got.headers[PATH] == path, got.text
            bodies[path] = got.json()
            plain = client.get("/v2.1/servers/detail?all_tenants=1", headers=ADMIN).json()
            listed = {s["id"] for s in plain["servers"]}
            assert not listed & {r["uuid"] for r in rows if r["forthcoming"]}
            assert listed == {r["uuid"] for r in rows if not (r["forthcoming"] or r["deleted"])}
        assert bodies["index"] == bodies["fanout"]
        assert {s["id"] for s in bodies["index"]["servers"]} == want
        return {s["id"]: s for s in bodies["index"]["servers"]}

    def close(self) -> None:
        self.index.close()
        self.fanout.close()
        self.engine.close()
        self.world.registry.close()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path)
    yield s
    s.close()


def call(client: TestClient, method: str, url: str, body: Any = None, token: Any = ADMIN) -> Any:
    return client.request(method, url, json=body, headers=token)


def test_reserve_modify_rename_commit(stack: Stack) -> None:
    api = stack.fanout
    made = call(api, "POST", "/v2.1/reservations", {"reservation": {"flavor": "m1.medium"}})
    assert made.status_code == 201, made.text
    uuid = made.json()["reservation"]["uuid"]
    assert made.json()["selections"][0]["cell_uuid"] == made.json()["reservation"]["cell_uuid"]
    listed = stack.agree()
    assert listed[uuid]["name"] is None or listed[uuid]["name"] == ""
    changed = call(api, "PUT", f"/v2.1/reservations/{uuid}", {
        "reservation": {"project_id": "p", "user_id": "u"}
    })  # fmt: skip
    assert changed.status_code == 200 and changed.json()["reservation"]["project_id"] == "p"
    stack.agree()
    renamed = call(api, "PUT", f"/v2.1/reservations/{uuid}", {"reservation": {"name": "web"}})
    assert renamed.json()["reservation"]["name"] == "web"
    assert stack.agree()[uuid]["name"] == "web"
    for client in (stack.index, stack.fanout):
        # A show by id answers a reservation as the forthcoming listing renders it.
        shown = client.get(f"/v2.1/servers/{uuid}", headers=ADMIN).json()["server"]
        assert (shown["name"], shown["status"]) == ("web", "BUILD")
        listed = client.get(
            "/v2.1/servers/detail?forthcoming=true&all_tenants=1", headers=ADMIN
        ).json()["servers"]
        assert [s for s in listed if s["id"] == uuid] == [shown]
    built = call(stack.index, "POST", f"/v2.1/reservations/{uuid}/commit")
    assert built.status_code == 200, built.text
    assert (built.json()["reservation"]["state"], built.json()["reservation"]["forthcoming"]) == (
        "active", False,
    )  # fmt: skip
    assert stack.agree() == {}
    for client in (stack.index, stack.fanout):
        server = client.get(f"/v2.1/servers/{uuid}", headers=ADMIN).json()["server"]
        assert (server["name"], server["status"]) == ("web", "ACTIVE")
        mine = client.get("/v2.1/servers", headers=MEMBER.copy() | {"X-Auth-Token": "u:p"})
        assert [s["id"] for s in mine.json()["servers"]] == [uuid]


def test_reserve_then_cancel_and_uuid_only_status_3(stack: Stack) -> None:
    uuid = "0b3e7c4c-0000-4000-8000-0000000000b1"
    made = call(stack.index, "POST", "/v2.1/reservations", {"reservation": {"uuid": uuid}})
    assert made.status_code == 201 and made.json()["selections"] == []
    stack.agree()
    for client in (stack.index, stack.fanout):
        body = {"fields": ["uuid", "name", "host", "forthcoming"], "filter": "forthcoming"}
        data = query(client, "instance", body).json()["data"]
        assert data == [[[0, uuid], [3, None], [3, None], [0, True]]]
    incomplete = call(stack.index, "POST", f"/v2.1/reservations/{uuid}/commit")
    assert incomplete.status_code == 409
    # The API's own field names (a probe: it said "display_name", a field it has not).
    said = incomplete.json()["conflictingRequest"]["message"]
    assert (
        said
        == f"reservation {uuid} cannot be committed without name, project_id, user_id, flavor, host"
    )
    assert call(stack.index, "DELETE", f"/v2.1/reservations/{uuid}").status_code == 204
    assert stack.agree() == {}
    again = call(stack.index, "DELETE", f"/v2.1/reservations/{uuid}")
    assert again.status_code == 409


@pytest.mark.parametrize(
    ("method", "url", "body", "token", "status", "words"),
    [
        ("POST", "/v2.1/reservations", {"reservation": {}}, MEMBER, 403, "admin-only"),
        ("POST", "/v2.1/reservations", {"reservation": {"flavr": "x"}}, ADMIN, 400, "flavr"),
        ("POST", "/v2.1/reservations", {"flavor": "m1.tiny"}, ADMIN, 400, "reservation"),
        ("POST", "/v2.1/reservations", {"reservation": {"flavor": "m9"}}, ADMIN, 400, "m9"),
        ("POST", "/v2.1/reservations", {"reservation": {"uuid": "x"}}, ADMIN, 400, "UUID"),
        ("POST", "/v2.1/reservations", {"reservation": {"cell": "mars"}}, ADMIN, 400, "mars"),
        ("POST", "/v2.1/reservations", {"reservation": {"name": "x" * 300}}, ADMIN, 400, "name"),
        ("PUT", "/v2.1/reservations/0b3e7c4c-0000-4000-8000-00000000dead",
         {"reservation": {"name": "a"}}, ADMIN, 404, "0b3e7c4c"),
        ("PUT", "/v2.1/reservations/x", {"reservation": {}}, ADMIN, 400, "Nothing to change"),
        ("POST", "/v2.1/reservations/nope/commit", None, ADMIN, 404, "nope"),
    ],
)  # fmt: skip
def test_bad_requests_are_named(
    stack: Stack, method: str, url: str, body: Any, token: Any, status: int, words: str
) -> None:
    got = call(stack.fanout, method, url, body, token)
    assert got.status_code == status, got.text
    (fault,) = got.json().values()
    assert words in fault["message"]
    assert stack.publisher.sent == []


def test_a_request_publishes_a_backlog_for_its_budget_only(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a bus outage a request published its cell's whole outbox before it answered
    (64.7 s for 30,000 in a probe). Now it stops at ``DELIVER_BUDGET`` (0 here: one
    batch), and the rest, its own notifications last, goes with the relay in order."""
    monkeypatch.setattr(reservations_routes, "DELIVER_BUDGET", 0.0)
    registry = stack.world.registry
    down = Operations(registry, FailingPublisher(), publisher_id="t")
    for cell in ("cell1", "cell2"):  # the reservation lands in either: a backlog in both
        booted = down.boot(BootRequest(f"old-{cell}", "m1.small", "p", "u", cell=cell))
        for i in range(110):
            down.rename(booted.instances[0].uuid, f"old-{cell}-{i}")
    backlog = 2 * (4 + 110)  # 4 for a boot, 1 a rename
    made = call(stack.fanout, "POST", "/v2.1/reservations", {"reservation": {"flavor": "m1.small"}})
    assert made.status_code == 201, made.text
    uuid = made.json()["reservation"]["uuid"]
    sent = stack.publisher.take()
    assert len(sent) == 100  # one batch of the backlog, in order
    assert all(getattr(n.payload, "uuid", None) != uuid for n in sent)
    rest = CollectingPublisher()
    cell = made.json()["reservation"]["cell_uuid"]
    (report,) = relay_cells(registry, Outbox(rest), [cell]).values()
    mine = [i for i, n in enumerate(rest.sent) if getattr(n.payload, "uuid", None) == uuid]
    # Its cell's backlog first, then its own (and its node's update, last).
    assert mine == [len(rest.sent) - 2] and rest.sent[-1].event_type == "compute_node.update"
    assert report.published == len(rest.sent) == backlog // 2 - 100 + 2
