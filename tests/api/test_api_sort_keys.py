"""Sort keys as Nova's ``_get_servers`` treats them (found from outside, against Nova's
``remove_invalid_sort_keys`` and its list schemas): a key Nova ignores is dropped with
the ``sort_dir`` at its place, so ``sort_key=id&sort_dir=asc`` is Nova's default order,
not ``created_at asc``; ``locked`` sorts only from 2.73; from 2.75 the ignored keys are
not in the schema's enum, a 400. Checked on the pure function and on both paths."""

from __future__ import annotations

from typing import Any

import pytest

from cellsight.api.auth import Principal
from cellsight.api.errors import ApiError
from cellsight.api.microversion import parse
from cellsight.api.sort_params import IGNORED_SORT_KEYS, parse_order
from cellsight.query.tree import Direction, SortKey, total_order
from tests.support.api_world import ADMIN
from tests.support.query2_world import Pair

ADMIN_PRINCIPAL = Principal("root", "admin", frozenset({"admin"}))
DEFAULT = total_order((SortKey("created_at", Direction.DESC),))


def order(keys: list[str], dirs: list[str], version: str = "2.1") -> tuple[SortKey, ...]:
    return parse_order(keys, dirs, ADMIN_PRINCIPAL, parse(version))


@pytest.mark.parametrize("dirs", [[], ["asc"], ["desc"]])
@pytest.mark.parametrize("key", sorted(IGNORED_SORT_KEYS - {"locked"}))
def test_an_ignored_key_takes_its_direction_with_it(key: str, dirs: list[str]) -> None:
    assert order([key], dirs) == DEFAULT
    assert order([key], dirs, "2.74") == DEFAULT


def test_the_directions_after_an_ignored_key_shift_as_in_nova() -> None:
    # keys [id, display_name], dirs [asc, desc]: Nova drops "asc" with id.
    assert order(["id", "display_name"], ["asc", "desc"])[0] == SortKey(
        "display_name", Direction.DESC
    )
    # An ignored key past the directions leaves them be.
    assert order(["display_name", "id"], ["asc"])[0] == SortKey("display_name", Direction.ASC)


def test_locked_sorts_from_273_only() -> None:
    assert order(["locked"], ["asc"], "2.72") == DEFAULT
    assert order(["locked"], ["asc"], "2.73")[0] == SortKey("locked", Direction.ASC)
    assert order(["locked"], ["asc"], "2.96")[0] == SortKey("locked", Direction.ASC)


@pytest.mark.parametrize("key", sorted(IGNORED_SORT_KEYS - {"locked"}))
def test_ignored_keys_are_a_400_from_275(key: str) -> None:
    with pytest.raises(ApiError) as caught:
        order([key], [], "2.75")
    assert caught.value.status == 400
    assert "sort_key" in str(caught.value)


def test_no_key_keeps_its_direction() -> None:
    # Nova's get_sort_params: no key is created_at, in the direction given.
    assert order([], ["asc"]) == total_order((SortKey("created_at", Direction.ASC),))


def _uuids(response: Any) -> list[str]:
    assert response.status_code == 200, response.text
    return [s["id"] for s in response.json()["servers"]]


@pytest.mark.parametrize(
    ("query", "version", "same_as"),
    [
        ("sort_key=id&sort_dir=asc", "2.1", ""),
        ("sort_key=vcpus&sort_dir=asc&sort_key=display_name&sort_dir=desc", "2.1",
         "sort_key=display_name&sort_dir=desc"),
        ("sort_key=locked&sort_dir=asc", "2.72", ""),
    ],
)  # fmt: skip
def test_both_paths_order_as_nova(pair: Pair, query: str, version: str, same_as: str) -> None:
    headers = {**ADMIN, "X-OpenStack-Nova-API-Version": version}
    base = "/v2.1/servers?all_tenants=1&limit=1000"
    for client in pair.both():
        got = _uuids(client.get(f"{base}&{query}", headers=headers))
        want = _uuids(client.get(f"{base}&{same_as}", headers=headers))
        assert len(got) > 10 and got == want
        ascending = _uuids(client.get(f"{base}&sort_key=created_at&sort_dir=asc", headers=headers))
        assert got != ascending  # the dropped key's "asc" did not survive


def test_both_paths_refuse_an_ignored_key_from_275(pair: Pair) -> None:
    headers = {**ADMIN, "X-OpenStack-Nova-API-Version": "2.75"}
    for client in pair.both():
        response = client.get("/v2.1/servers?sort_key=id", headers=headers)
        assert response.status_code == 400, response.text
        assert "sort_key" in response.text
