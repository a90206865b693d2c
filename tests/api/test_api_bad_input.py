"""Bad input anywhere gets a 4xx naming what was wrong, in Nova's fault shape; never 500."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cellsight.api.params import KNOWN
from cellsight.settings import load_settings
from tests.support.api_world import ADMIN, World, make_client

MEMBER = {"X-Auth-Token": "someone:some-project"}
V275 = {"OpenStack-API-Version": "compute 2.75"}


@pytest.fixture(scope="module")
def client(sqlite_world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with make_client(tmp_path_factory.mktemp("bad"), sqlite_world) as c:
        yield c


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("limit=-1", "limit"),
        ("limit=abc", "limit"),
        ("limit=1.5", "limit"),
        ("limit=", "limit"),
        ("limit=%D9%A3", "limit"),  # an Arabic-Indic digit is not a limit
        ("sort_key=bogus", "sort_key"),
        ("sort_dir=up", "sort_dir"),
        ("sort_key=display_name&sort_dir=asc&sort_dir=desc", "sort_dir"),
        ("status=RUNNING", "status"),
        ("power_state=on", "power_state"),
        ("locked=maybe", "locked"),
        ("changes-since=yesterday", "changes-since"),
        ("changes-before=2020-13-01", "changes-before"),
        ("changes-since=2021-01-01T00:00:00Z&changes-before=2020-01-01T00:00:00Z", "changes-since"),
        ("name=(a", "name"),
        ("name=(a%2B)%2B", "name"),  # nested quantifiers: a ReDoS pattern
        ("name=" + ".%3F" * 16 + "093", "name"),  # 2 ** 16 ways at each start (a probe)
        ("name=" + "a" * 300, "name"),
        ("ip=[", "ip"),
        ("frobnicate=1", "frobnicate"),
        ("all_tenants=perhaps", "all_tenants"),
        ("user_id=" + "u" * 300, "user_id"),
    ],
)
def test_bad_values_are_400_naming_the_parameter(
    client: TestClient, query: str, parameter: str
) -> None:
    # 2.75: every parameter here is in Nova's schema, and unknown ones are refused.
    response = client.get(f"/v2.1/servers?{query}", headers={**ADMIN, **V275})
    assert response.status_code == 400, response.text
    message = response.json()["badRequest"]["message"]
    assert parameter in message
    assert response.json()["badRequest"]["code"] == 400


@pytest.mark.parametrize(
    ("query", "same_as"),
    [
        ("tags=", None),
        ("tags=a,,b", None),
        ("tags-any=,prod,", "tags-any=prod"),
        ("not-tags=", ""),
        ("not-tags-any=", ""),
        ("not-tags-any=,prod", "not-tags-any=prod"),
    ],
)
def test_an_empty_tag_is_a_tag_no_server_has(
    client: TestClient, query: str, same_as: str | None
) -> None:
    """As Nova's database query answers it (from its source: the value is split on
    commas, each piece an exact tag); it was a 400 here (a probe with Nova's source)."""
    headers = {**ADMIN, "OpenStack-API-Version": "compute 2.26"}

    def listed(q: str) -> list[str]:
        response = client.get(f"/v2.1/servers?all_tenants=1&limit=1000&{q}", headers=headers)
        assert response.status_code == 200, response.text
        return [s["id"] for s in response.json()["servers"]]

    got = listed(query)
    if same_as is None:
        assert got == []
    else:
        assert got == listed(same_as) and got


def test_unknown_marker_is_400(client: TestClient) -> None:
    response = client.get("/v2.1/servers?marker=not-a-uuid", headers=ADMIN)
    assert response.status_code == 400
    assert response.json() == {
        "badRequest": {"code": 400, "message": "marker [not-a-uuid] not found"}
    }


@pytest.mark.parametrize("headers", [{}, {"X-Auth-Token": ""}, {"X-Auth-Token": ":"}])
def test_missing_token_is_401(client: TestClient, headers: dict[str, str]) -> None:
    response = client.get("/v2.1/servers", headers=headers)
    assert response.status_code == 401
    assert response.json()["unauthorized"]["code"] == 401


def test_token_file_mode(sqlite_world: World, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps({"s3cret": {"user_id": "ops", "project_id": "ops", "roles": ["admin"]}})
    )
    with make_client(tmp_path, sqlite_world, auth_mode="token", token_file=tokens) as c:
        assert (
            c.get("/v2.1/servers?all_tenants=1", headers={"X-Auth-Token": "s3cret"}).status_code
            == 200
        )
        assert c.get("/v2.1/servers", headers={"X-Auth-Token": "root:admin"}).status_code == 401


def test_token_mode_without_a_file_is_a_config_error(tmp_path: Path) -> None:
    from cellsight.api.auth import Authenticator
    from cellsight.settings import ConfigError

    with pytest.raises(ConfigError, match="token_file"):
        Authenticator.from_settings(load_settings(data_dir=tmp_path, auth_mode="token"))


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"OpenStack-API-Version": "compute 3.0"}, 406),
        ({"OpenStack-API-Version": "compute 2.1000"}, 406),
        ({"OpenStack-API-Version": "compute two"}, 400),
        ({"X-OpenStack-Nova-API-Version": "2.97"}, 406),
        ({"OpenStack-API-Version": "compute latest"}, 200),
        ({"OpenStack-API-Version": "compute 2.47"}, 200),
    ],
)
def test_microversions(client: TestClient, headers: dict[str, str], status: int) -> None:
    response = client.get("/v2.1/servers", headers={**ADMIN, **headers})
    assert response.status_code == status, response.text
    if status == 200:
        assert response.headers["OpenStack-API-Version"].startswith("compute 2.")


@pytest.mark.parametrize(
    ("given", "named"), [("2.1234567", "2.1234567"), ("12345678.1", "12345678.1")]
)
def test_a_version_part_past_six_digits_is_a_406_naming_it(
    client: TestClient, given: str, named: str
) -> None:
    # It said "Version 2...234567" and "123456...1" (found from outside).
    response = client.get("/v2.1/servers", headers={**ADMIN, "X-OpenStack-Nova-API-Version": given})
    assert response.status_code == 406
    assert f"Version {named} is not supported" in response.text


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("name=%ff%fe", "name"),
        ("marker=abc%C3", "marker"),
        ("%ff=1", "%ff"),  # as sent (an adversarial probe: it was U+FFFD)
        ("a%fe%ff=1", "a%fe%ff"),
        ("a=1&tags=x%e9", "tags"),
    ],
)
def test_a_parameter_that_is_not_utf8_is_a_400_naming_it(
    client: TestClient, query: str, named: str
) -> None:
    # It was decoded with U+FFFD in each bad byte's place, and matched nothing (found
    # from outside); on every route, before it is parsed.
    for path in ("/v2.1/servers", "/v2.1/servers/detail", "/v2.1/query/instance"):
        response = client.get(f"{path}?{query}", headers=ADMIN)
        assert response.status_code == 400, (path, response.text)
        assert f"query parameters {named}: not valid UTF-8" in response.text
    assert client.get("/v2.1/servers?name=%C3%A9", headers=ADMIN).status_code == 200


def test_unknown_routes_and_methods(client: TestClient) -> None:
    assert (
        client.get("/v2.1/nothing/here/at/all", headers=ADMIN).json()["itemNotFound"]["code"] == 404
    )
    response = client.post("/v2.1/servers/detail", headers=ADMIN)
    assert response.status_code == 405 and response.json()["badMethod"]["code"] == 405


JUNK = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    params=st.lists(st.tuples(st.one_of(st.sampled_from(sorted(KNOWN)), JUNK), JUNK), max_size=4),
    admin=st.booleans(),
    detail=st.booleans(),
)
def test_junk_never_gets_a_500(
    client: TestClient, params: list[tuple[str, str]], admin: bool, detail: bool
) -> None:
    path = "/v2.1/servers/detail" if detail else "/v2.1/servers"
    response = client.get(f"{path}?{urlencode(params)}", headers=ADMIN if admin else MEMBER)
    assert response.status_code in (200, 400, 403), (params, response.text)
    if response.status_code != 200:
        (fault,) = response.json().values()
        assert fault["code"] == response.status_code and fault["message"]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(server_id=JUNK.filter(lambda s: s not in ("", ".", "..", "detail")))
# An encoded slash was decoded into a separator: '/' answered the list, 'detail/' the
# detailed list (Starlette's trailing-slash redirect), found by this test.
@example(server_id="/")
@example(server_id="//")
@example(server_id="detail/")
@example(server_id="/detail")
def test_junk_server_ids_are_404(client: TestClient, server_id: str) -> None:
    response = client.get(f"/v2.1/servers/{quote(server_id, safe='')}", headers=ADMIN)
    assert response.status_code == 404, response.text


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/v2.1/servers/%ff", "Instance %ff could not be found."),
        ("/v2.1/servers/%FE%ff", "Instance %FE%ff could not be found."),
        ("/v2.1/servers/a%c3", "Instance a%c3 could not be found."),
        ("/v2.1/query/%ff/fields", "Unknown query resource '%ff'"),
        ("/v2.1/query/%ff?fields=uuid", "Unknown query resource '%ff'"),
    ],
)
def test_path_segments_not_utf8_are_named_as_sent(
    client: TestClient, path: str, named: str
) -> None:
    # The server decoded each bad byte as U+FFFD, so every such id got one message.
    response = client.get(path, headers=ADMIN)
    assert response.status_code == 404, response.text
    assert named in response.json()["itemNotFound"]["message"]


def test_path_segment_utf8_and_encoded_slash_still_decode(client: TestClient) -> None:
    response = client.get("/v2.1/servers/%C3%A9%2Fx", headers=ADMIN)
    assert response.status_code == 404
    assert response.json()["itemNotFound"]["message"] == "Instance é%2Fx could not be found."
