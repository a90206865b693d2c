"""The server list reads its parameters and headers as Nova reads them: found by an
adversarial probe against Nova's source (2026-11-27), on both paths.

* ``sort_dir``: Nova's listing checks the directions left once ignored keys are dropped
  with theirs (``process_sort_params``): more directions than keys, or one that is not
  ``asc``/``desc``, is a 400, also when every key was ignored or none was given.
* Microversions as ``microversion_parse`` reads them: the last ``compute`` entry of the
  header's lines, an entry without a version passed over for the legacy header, whose
  last comma-separated part counts; ``latest`` only so spelt.
* A marker is looked up as given (``marker [ ] not found``); only an empty one is none.
* ``description`` filters nothing in Nova (no such Instance column); its alias
  ``display_description`` does.
* An administrator lists their own project without a true ``all_tenants``, whatever
  ``project_id``/``tenant_id`` say; with it, the one named later in the query string.
* Of ``name`` and ``display_name`` the later one counts; a repeated ``vm_state`` is its
  last value.
* A regex filter of nothing but anchors matches as the databases' operators do.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import pytest

from tests.support.api_world import ADMIN
from tests.support.query2_world import Pair


def _get(client: Any, query: str | list[tuple[str, str]], **headers: str) -> Any:
    text = query if isinstance(query, str) else urlencode(query)
    return client.get(f"/v2.1/servers?{text}", headers={**ADMIN, **headers})


def _ids(response: Any) -> list[str]:
    assert response.status_code == 200, response.text
    servers = response.json()["servers"]
    assert len(servers) < 1000  # one page holds them all
    return [s["id"] for s in servers]


def _all(client: Any, *pairs: tuple[str, str]) -> list[str]:
    return _ids(_get(client, [("all_tenants", "1"), ("limit", "1000"), *pairs]))


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("sort_dir=asc&sort_dir=desc", "Sort direction size exceeds sort key size"),
        ("sort_key=id&sort_dir=asc&sort_dir=desc", "Sort direction size exceeds sort key size"),
        ("sort_key=display_name&sort_dir=asc&sort_dir=desc", "exceeds sort key size"),
        ("sort_key=id&sort_dir=asc&sort_dir=up", "sort_dir must be 'asc' or 'desc'"),
        ("sort_dir=up", "sort_dir must be 'asc' or 'desc'"),
    ],
)
def test_directions_left_over_are_a_400(pair: Pair, query: str, message: str) -> None:
    for client in pair.both():
        response = _get(client, f"all_tenants=1&{query}")
        assert response.status_code == 400, response.text
        assert message in response.text


def test_a_direction_dropped_with_its_ignored_key_is_not_checked(pair: Pair) -> None:
    for client in pair.both():
        default = _all(client)
        assert _all(client, ("sort_key", "id"), ("sort_dir", "up")) == default
        ascending = _all(client, ("sort_dir", "asc"))
        assert ascending != default and sorted(ascending) == sorted(default)


@pytest.mark.parametrize(
    ("headers", "answered"),
    [
        ([("OpenStack-API-Version", "compute"), ("X-OpenStack-Nova-API-Version", "2.5")], "2.5"),
        ([("X-OpenStack-Nova-API-Version", "2.5, 2.6")], "2.6"),
        (
            [("OpenStack-API-Version", "compute 2.5"), ("OpenStack-API-Version", "compute 2.60")],
            "2.60",
        ),
        ([("OpenStack-API-Version", "compute 2.7, network 9.9, compute 2.8")], "2.8"),
        ([("OpenStack-API-Version", "compute latest")], "2.96"),
    ],
)
def test_microversion_headers_read_as_nova_reads_them(
    pair: Pair, headers: list[tuple[str, str]], answered: str
) -> None:
    for client in pair.both():
        response = client.get("/v2.1/servers", headers=[*ADMIN.items(), *headers])
        assert response.status_code == 200, response.text
        assert response.headers["OpenStack-API-Version"] == f"compute {answered}"


@pytest.mark.parametrize(
    "headers",
    [
        {"OpenStack-API-Version": "compute LATEST"},
        {"X-OpenStack-Nova-API-Version": "Latest"},
        {"X-OpenStack-Nova-API-Version": ""},
    ],
)
def test_a_version_nova_cannot_read_is_a_400(pair: Pair, headers: dict[str, str]) -> None:
    for client in pair.both():
        response = client.get("/v2.1/servers", headers={**ADMIN, **headers})
        assert response.status_code == 400, response.text
        assert "is of invalid format" in response.text


def test_a_marker_is_looked_up_as_given(pair: Pair) -> None:
    for client in pair.both():
        first = _all(client)[0]
        response = _get(client, urlencode({"all_tenants": "1", "marker": f" {first}"}))
        assert response.status_code == 400, response.text
        assert f"marker [ {first}] not found" in response.text
        assert _ids(_get(client, "all_tenants=1&limit=1000&marker=")) == _all(client)


def test_description_filters_nothing_and_display_description_does(pair: Pair) -> None:
    for client in pair.both():
        everything = _all(client)
        assert _all(client, ("description", "no such text")) == everything
        assert _all(client, ("display_description", "no such text")) == []


def test_an_administrator_lists_other_projects_only_with_all_tenants(
    pair: Pair, docs: list[dict[str, Any]]
) -> None:
    live = {d["uuid"] for d in docs if not d.get("deleted") and not d.get("forthcoming")}
    projects = sorted({d["tenant_id"] for d in docs if d["uuid"] in live})
    a, b = projects[0], projects[-1]
    in_a = {d["uuid"] for d in docs if d["uuid"] in live and d["tenant_id"] == a}
    in_b = {d["uuid"] for d in docs if d["uuid"] in live and d["tenant_id"] == b}
    assert a != b and in_a and in_b
    for client in pair.both():
        own = _ids(_get(client, "limit=1000"))  # the administrator's project: "admin"
        assert _ids(_get(client, f"limit=1000&project_id={a}")) == own
        assert _ids(_get(client, f"limit=1000&all_tenants=0&tenant_id={a}")) == own
        assert set(_all(client, ("project_id", a))) == in_a
        assert set(_all(client, ("project_id", a), ("tenant_id", b))) == in_b
        assert set(_all(client, ("tenant_id", b), ("project_id", a))) == in_a
        assert _all(client, ("project_id", "")) == []


def test_of_name_and_display_name_the_later_one_counts(pair: Pair) -> None:
    for client in pair.both():
        named = _all(client, ("name", "."))
        nothing = ("display_name", "^no such name$")
        assert named  # else the test proves nothing
        assert _all(client, ("name", "."), nothing) == []
        assert _all(client, nothing, ("name", ".")) == named


def test_a_repeated_vm_state_is_its_last_value(pair: Pair) -> None:
    for client in pair.both():
        active = _all(client, ("vm_state", "active"))
        stopped = _all(client, ("vm_state", "stopped"))
        assert active and stopped  # else the test proves nothing
        assert _all(client, ("vm_state", "active"), ("vm_state", "stopped")) == stopped
        assert _all(client, ("vm_state", "stopped"), ("vm_state", "active")) == active


def test_anchors_alone_match_as_the_databases_regex_operators_do(
    pair: Pair, docs: list[dict[str, Any]]
) -> None:
    unnamed = {d["uuid"] for d in docs if d.get("display_name") is None}
    empty = {d["uuid"] for d in docs if d.get("display_name") == ""}
    for client in pair.both():
        everything = _all(client)
        for pattern in ("", "^", "$"):
            assert _all(client, ("name", pattern)) == [u for u in everything if u not in unnamed]
        assert set(_all(client, ("name", "^$"))) == empty & set(everything)
        # Nova asks Neutron only for non-empty addresses.
        assert _all(client, ("ip", "")) == []
        assert _all(client, ("ip", ""), ("ip6", ":")) == _all(client, ("ip6", ":")) != []
