"""Reservations over HTTP at their edges: an unavailable cell is a 503 that names no
database; NUL characters and paths that are not uuids are 4xx on every dialect (never a
500); the node cache sees a reservation's claim even when its notifications could not be
published (bus down, or another relay holds the cell's outbox), and re-reads only that
cell; a node registered after its cell was cached is heard."""

from __future__ import annotations

import json
import uuid as uuidlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from cellsight.cells import outbox
from cellsight.cells.mappings import CellRegistry
from cellsight.cells.nodeevents import register_node
from cellsight.cells.nodes import add_compute_node
from cellsight.cells.operations import Operations
from cellsight.cells.outbox import LEASE_NAME
from cellsight.cells.schema import compute_nodes, outbox_lease, utcnow
from tests.api.test_reservations_http import NODE, Stack
from tests.support.api_world import World, make_client
from tests.support.outages import lose
from tests.support.publishers import CollectingPublisher, FailingPublisher
from tests.support.query2_world import ADMIN, state
from tests.support.services import DIALECTS, DatabaseFactory


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path)
    yield s
    s.close()


def lenient(client: TestClient) -> TestClient:
    """The same app, answering a server error as a 500 instead of raising it."""
    return TestClient(client.app, raise_server_exceptions=False)


def used_on(client: TestClient, host: str) -> list[Any]:
    body = {"fields": ["vcpus_used", "forthcoming_reservations"], "filter": ["==", "host", host]}
    got = client.post("/v2.1/query/node", json=body, headers=ADMIN)
    assert got.status_code == 200, got.text
    return [[value for _, value in row] for row in got.json()["data"]]


def test_an_unavailable_cell_is_a_503_naming_no_database(stack: Stack) -> None:
    api = lenient(stack.fanout)
    made = api.post("/v2.1/reservations", json={"reservation": {"cell": "cell2"}}, headers=ADMIN)
    uuid = made.json()["reservation"]["uuid"]
    registry = stack.world.registry
    lose(registry, registry.get_cell("cell2"))  # its SQLite file gone
    for method, url, body in [
        ("POST", "/v2.1/reservations", {"reservation": {"cell": "cell2"}}),
        ("PUT", f"/v2.1/reservations/{uuid}", {"reservation": {"name": "x"}}),
        ("POST", f"/v2.1/reservations/{uuid}/commit", None),
        ("DELETE", f"/v2.1/reservations/{uuid}", None),
    ]:
        got = api.request(method, url, json=body, headers=ADMIN)
        assert got.status_code == 503, (method, url, got.text)
        assert "cell2.db" not in got.text and "sqlite" not in got.text
    # The cell that answers still takes reservations, by host or by the scheduler.
    for given in ({"host": "cell1-h1"}, {"flavor": "m1.small"}):
        got = api.post("/v2.1/reservations", json={"reservation": given}, headers=ADMIN)
        assert got.status_code == 201, got.text
        assert got.json()["reservation"]["host"].startswith("cell1-")


@pytest.fixture(params=DIALECTS)
def client(
    request: pytest.FixtureRequest, make_database: DatabaseFactory, tmp_path: Path
) -> Iterator[TestClient]:
    registry = CellRegistry(make_database(request.param))
    registry.create_schema()
    cell = registry.add_cell("cell1", make_database(request.param))
    add_compute_node(registry.cell_engine(cell), "h1", **NODE)
    api = lenient(make_client(tmp_path / "api", World(registry, request.param)))
    state(api).publisher = CollectingPublisher()
    yield api
    api.close()
    registry.close()


@pytest.mark.services
def test_nul_characters_and_non_uuid_paths_are_4xx(client: TestClient) -> None:
    for field in ("name", "project_id", "user_id", "host", "cell", "flavor"):
        # NUL, which PostgreSQL cannot hold, and what else Nova's name pattern refuses.
        for bad in ("\x00", "\x01", "\x7f", "\u2028", "\u200b"):
            body = json.dumps({"reservation": {field: f"a{bad}b"}})
            got = client.post("/v2.1/reservations", content=body, headers=ADMIN)
            assert got.status_code == 400, (field, got.text)
            message = got.json()["badRequest"]["message"]
            assert f"reservation.{field}" in message and f"U+{ord(bad):04X}" in message
    # An unknown key is named, a lone surrogate as its escape (it was
    # "reservation.reservation: Input should be a valid string").
    for key, named in (("colour", "colour"), ("\ud800", "\\ud800")):
        body = json.dumps({"reservation": {key: 1}})
        got = client.post("/v2.1/reservations", content=body, headers=ADMIN)
        assert got.status_code == 400, got.text
        assert got.json()["badRequest"]["message"] == (
            f"reservation.{named}: Extra inputs are not permitted"
        )
    made = client.post("/v2.1/reservations", json={"reservation": {}}, headers=ADMIN)
    uuid = made.json()["reservation"]["uuid"]
    changed = client.put(
        f"/v2.1/reservations/{uuid}", json={"reservation": {"name": "x\x00"}}, headers=ADMIN
    )
    assert changed.status_code == 400, changed.text
    for path in ("%00", "a%00b", "%C3%A9", "%ED%A0%80", "x" * 300):
        for method, suffix, payload in [
            ("PUT", "", {"reservation": {"name": "a"}}),
            ("POST", "/commit", None),
            ("DELETE", "", None),
        ]:
            got = client.request(
                method, f"/v2.1/reservations/{path}{suffix}", json=payload, headers=ADMIN
            )
            assert got.status_code == 404, (method, path, got.text)
    # Nova's show answers 404 for an id that is not a uuid, on every dialect.
    for path in ("%00", "a%00b", "%C3%A9", "%ED%A0%80", "x" * 300):
        got = client.get(f"/v2.1/servers/{path}", headers=ADMIN)
        assert got.status_code == 404, (path, got.text)
        assert "could not be found" in got.json()["itemNotFound"]["message"]
    upper = client.put(
        f"/v2.1/reservations/{uuid.upper()}", json={"reservation": {"name": "u"}}, headers=ADMIN
    )
    assert upper.status_code == 200 and upper.json()["reservation"]["name"] == "u"


@pytest.mark.services
def test_blank_attributes_are_a_400_naming_them(client: TestClient) -> None:
    """``null`` clears or omits an attribute; a blank string is a bad value, not a way to
    say the same (a cell '' picked one, a name '' was kept)."""
    for field in ("name", "project_id", "user_id", "host", "cell", "flavor"):
        for blank in ("", "  "):
            body = {"reservation": {"flavor": "m1.small", field: blank}}
            got = client.post("/v2.1/reservations", json=body, headers=ADMIN)
            assert got.status_code == 400, (field, got.text)
            assert f"{field} must not be empty" in got.json()["badRequest"]["message"]
    made = client.post("/v2.1/reservations", json={"reservation": {}}, headers=ADMIN)
    assert made.status_code == 201, made.text
    uuid = made.json()["reservation"]["uuid"]
    for field in ("name", "project_id", "user_id", "host", "flavor"):
        got = client.put(
            f"/v2.1/reservations/{uuid}", json={"reservation": {field: ""}}, headers=ADMIN
        )
        assert got.status_code == 400, (field, got.text)
        assert f"{field} must not be empty" in got.json()["badRequest"]["message"]


def test_the_node_cache_sees_a_claim_whose_notifications_were_not_published(
    stack: Stack,
) -> None:
    api = stack.fanout
    state(api).publisher = FailingPublisher()
    assert used_on(api, "cell1-h1") == [[0, 0]]  # cached now (10 minutes)
    body = {"reservation": {"flavor": "m1.large", "host": "cell1-h1"}}
    made = api.post("/v2.1/reservations", json=body, headers=ADMIN)
    assert made.status_code == 201, made.text
    assert used_on(api, "cell1-h1") == [[4, 1]]
    gone = api.delete(f"/v2.1/reservations/{made.json()['reservation']['uuid']}", headers=ADMIN)
    assert gone.status_code == 204
    assert used_on(api, "cell1-h1") == [[0, 0]]


def test_the_node_cache_sees_a_claim_published_by_another_relay(stack: Stack) -> None:
    api = stack.fanout
    assert used_on(api, "cell2-h1") == [[0, 0]]
    cell = stack.world.registry.get_cell("cell2")
    engine = stack.world.registry.cell_engine(cell)
    outbox.ensure_tables(engine)
    with engine.begin() as conn:  # another relay's lease: our rows wait for it
        conn.execute(
            outbox_lease.insert().values(
                name=LEASE_NAME, holder="elsewhere", expires_at=utcnow() + timedelta(hours=1)
            )
        )
    body = {"reservation": {"flavor": "m1.large", "host": "cell2-h1"}}
    made = api.post("/v2.1/reservations", json=body, headers=ADMIN)
    assert made.status_code == 201, made.text
    assert stack.publisher.sent == []  # nothing went out through this process
    assert used_on(api, "cell2-h1") == [[4, 1]]


def test_a_node_registered_after_its_cell_was_cached_is_heard(stack: Stack) -> None:
    api = stack.fanout
    before = api.post("/v2.1/query/node", json={"fields": ["host"]}, headers=ADMIN).json()
    cache = state(api).node_cache
    elsewhere = CollectingPublisher()
    ops = Operations(stack.world.registry, elsewhere, publisher_id="elsewhere")
    register_node(ops, "cell1", "cell1-h3", **NODE)
    (event,) = elsewhere.sent
    cache.observe(event.event_type, event.payload)  # as the bus listener hands it over
    after = api.post("/v2.1/query/node", json={"fields": ["host"]}, headers=ADMIN).json()
    hosts = sorted(row[0][1] for row in after["data"])
    assert len(after["data"]) == len(before["data"]) + 1 and "cell1-h3" in hosts


def test_a_reservation_rereads_only_its_own_cell(stack: Stack) -> None:
    api = stack.fanout
    assert used_on(api, "cell2-h1") == [[0, 0]]
    cell2 = stack.world.registry.get_cell("cell2")
    with stack.world.registry.cell_engine(cell2).begin() as conn:  # unannounced change
        conn.execute(compute_nodes.update().values(vcpus_used=1))
    body = {"reservation": {"flavor": "m1.large", "host": "cell1-h1"}}
    assert api.post("/v2.1/reservations", json=body, headers=ADMIN).status_code == 201
    assert used_on(api, "cell1-h1") == [[4, 1]]
    assert used_on(api, "cell2-h1") == [[0, 0]]  # still the cached entry: not re-read


def test_the_api_relays_under_the_outbox_lease_setting(stack: Stack, tmp_path: Path) -> None:
    """The reservation routes publish the cell's outbox under ``outbox_lease``, as the
    CLI and the indexer's relay do (it was a fixed 30 s)."""
    registry = stack.world.registry
    engine = registry.cell_engine(registry.get_cell("cell1"))
    seen: list[float] = []

    class LeaseWatcher(CollectingPublisher):
        def publish_many(self, notifications: Any) -> None:
            with engine.connect() as conn:
                expires = conn.execute(sa.select(outbox_lease.c.expires_at)).scalar_one()
            seen.append((expires - utcnow()).total_seconds())
            super().publish_many(notifications)

    api = make_client(tmp_path / "lease", stack.world, outbox_lease=300.0)
    state(api).publisher = LeaseWatcher()
    got = api.post("/v2.1/reservations", json={"reservation": {"cell": "cell1"}}, headers=ADMIN)
    assert got.status_code == 201, got.text
    assert seen and all(250 < left <= 300 for left in seen), seen


def test_a_reservation_uuid_in_any_spelling_the_cli_takes(client: TestClient) -> None:
    """Braces and ``urn:uuid:`` in the body, as the CLI and the paths take them (the body
    refused them past 36 characters); stored and answered in the canonical form."""
    for spelling in ("{%s}", "urn:uuid:%s", "urn:uuid:{%s}", "%s"):
        want = str(uuidlib.uuid4())
        given = spelling % (want.upper() if spelling == "%s" else want)
        made = client.post(
            "/v2.1/reservations", json={"reservation": {"uuid": given}}, headers=ADMIN
        )
        assert made.status_code == 201, made.text
        assert made.json()["reservation"]["uuid"] == want
        shown = client.put(
            f"/v2.1/reservations/{given.replace('{', '%7B').replace('}', '%7D')}",
            json={"reservation": {"name": "n"}},
            headers=ADMIN,
        )
        assert shown.status_code == 200 and shown.json()["reservation"]["uuid"] == want


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b'{"reservation": {"name": ' + b"1" * 4301 + b"}}", "a number has more than 4300"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"reservation": {"name": "x"', "Expecting ',' delimiter at line 1"),
        (b'{"reservation": {"name": "' + b"x" * (1024 * 1024) + b'"}}', "over 1048576 bytes"),
    ],
)
def test_a_body_that_is_no_json_says_why(client: TestClient, raw: bytes, says: str) -> None:
    """A probe: a 4,301-digit number and a body nested 100,000 deep were both "not valid
    JSON", saying no more, and a body had no size bound; as the query API says them."""
    headers = {**ADMIN, "Content-Type": "application/json"}
    path = f"/v2.1/reservations/{uuidlib.uuid4()}"
    for method, url in (("POST", "/v2.1/reservations"), ("PUT", path)):
        got = client.request(method, url, content=raw, headers=headers)
        assert got.status_code == 400, (method, got.text)
        assert says in got.json()["badRequest"]["message"], got.text


@pytest.mark.parametrize(
    ("inner", "named"),
    [("null", "null"), ("[]", "an array"), ('"m1.small"', "a string"), ("7", "a number")],
)
def test_a_reservation_that_is_no_object_is_named_as_such(
    client: TestClient, inner: str, named: str
) -> None:
    """A probe: ``{"reservation": null}`` was "reservation.reservation: Input should be a
    valid dictionary or instance of NewReservation", a class the client never sent."""
    headers = {**ADMIN, "Content-Type": "application/json"}
    path = f"/v2.1/reservations/{uuidlib.uuid4()}"
    for method, url in (("POST", "/v2.1/reservations"), ("PUT", path)):
        got = client.request(method, url, content=f'{{"reservation": {inner}}}', headers=headers)
        assert got.status_code == 400, (method, got.text)
        message = got.json()["badRequest"]["message"]
        assert message == f"reservation: must be an object, not {named}", message
