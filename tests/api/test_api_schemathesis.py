"""schemathesis over the API's own OpenAPI document, as an administrator and as a
member: generated requests for every operation (query parameters, microversion
headers, query v2 bodies), checked for no 5xx and responses that conform to the
document (statuses, content types, fault bodies). Bounded examples keep CI fast;
``CELLSIGHT_SCHEMATHESIS_EXAMPLES`` raises them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from cellsight.api.app import create_app
from cellsight.api.errors import BadRequest
from cellsight.api.routes.reservations import NewReservation, ReservationChange, _parse
from cellsight.cells.text_rules import unprintable
from tests.support.api_world import World, api_settings, project_tokens

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.specs.openapi import checks  # noqa: E402

EXAMPLES = int(os.environ.get("CELLSIGHT_SCHEMATHESIS_EXAMPLES", "25"))


@pytest.fixture(scope="module")
def api_app(sqlite_world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    app = create_app(
        api_settings(tmp_path_factory.mktemp("schemathesis")), registry=sqlite_world.registry
    )
    with TestClient(app):  # the lifespan: the app closes what requests opened (the bus)
        yield app


CHECKS = [
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


def check(case: Any, token: str) -> None:
    headers = dict(case.headers or {})
    headers["X-Auth-Token"] = token
    response = case.call(headers=headers)
    assert response.status_code < 500, (case.as_curl_command(), response.text[:500])
    case.validate_response(response, checks=CHECKS)


def run_every_operation(app: FastAPI, token: str) -> int:
    """Every operation of the document, ``EXAMPLES`` generated requests each."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    ran = 0
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            check(case, token)

        run()
        ran += 1
    return ran


@pytest.mark.parametrize("role", ["admin", "member"])
def test_generated_requests(api_app: FastAPI, sqlite_world: World, role: str) -> None:
    token = "root:admin" if role == "admin" else project_tokens(sqlite_world)[0]["X-Auth-Token"]
    assert run_every_operation(api_app, token) >= 10


def test_the_document_describes_the_servers_parameters(api_app: FastAPI) -> None:
    doc = api_app.openapi()
    listing = doc["paths"]["/v2.1/servers/detail"]["get"]
    names = {p["name"]: p for p in listing["parameters"]}
    assert {
        "limit",
        "marker",
        "status",
        "sort_key",
        "changes-since",
        "OpenStack-API-Version",
    } <= set(names)
    assert names["status"]["schema"]["type"] == "array" and names["status"]["explode"] is True
    assert "ACTIVE" in names["status"]["schema"]["items"]["enum"]
    assert doc["components"]["securitySchemes"]["XAuthToken"]["name"] == "X-Auth-Token"
    assert listing["security"] == [{"XAuthToken": []}]
    assert {"400", "401", "403", "503"} <= set(listing["responses"])


@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/v2.1/reservations"), ("PUT", "/v2.1/reservations/{uuid}")]
)
def test_the_document_describes_the_reservation_bodies(
    api_app: FastAPI, method: str, path: str
) -> None:
    """Every body the document allows is one the route's parser takes (but for the
    characters the fields' descriptions rule out, Nova's name pattern's, NUL among
    them), so generated requests reach the operation, not a 400 for the body's shape."""
    model = NewReservation if method == "POST" else ReservationChange
    schema = schemathesis.openapi.from_asgi("/openapi.json", api_app)
    operation = schema[path][method]
    described = operation.definition.raw["requestBody"]["content"]["application/json"]["schema"]
    assert set(described["properties"]["reservation"]["properties"]) == set(model.model_fields)

    @given(case=operation.as_strategy())
    @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
    def parsed(case: Any) -> None:
        raw = json.dumps(case.body).encode()
        try:
            _parse(model, raw)
        except BadRequest as exc:
            values = case.body["reservation"].values()
            assert any(unprintable(v) for v in values if isinstance(v, str)), (case.body, exc)

    parsed()
