"""Nova's status map, power states, hostId, the renderer's keys and links, the order key."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

from cellsight.api import status as st
from cellsight.api.merge_order import order_key
from cellsight.api.microversion import Version
from cellsight.api.render import LinkContext, detail, host_id, summary
from cellsight.query.tree import (
    Direction,
    SortKey,
)
from tests.support.query_dataset import matches  # the tests' one filter-tree oracle

NAMED_TASKS = sorted({t for m in st.STATE_MAP.values() for t in m if t != st.DEFAULT})
TASK_STATES = [*NAMED_TASKS, None, "other"]


@pytest.mark.parametrize("status", sorted(st.STATUSES))
def test_a_status_filter_matches_exactly_the_pairs_shown_with_that_status(status: str) -> None:
    node = st.status_filter([status.lower()])
    for vm_state in [*st.STATE_MAP, "unknown-state"]:
        for task_state in TASK_STATES:
            doc = {"state": vm_state, "task_state": task_state}
            shown = st.status_from_state(vm_state, task_state)
            assert matches(node, doc) == (shown == status), (vm_state, task_state)


def test_several_statuses_are_a_union() -> None:
    node = st.status_filter(["ACTIVE", "REBOOT"])
    assert matches(node, {"state": "active", "task_state": None})
    assert matches(node, {"state": "active", "task_state": "rebooting"})
    assert not matches(node, {"state": "active", "task_state": "rebooting_hard"})


def test_nova_status_examples() -> None:
    assert st.status_from_state("active", None) == "ACTIVE"
    assert st.status_from_state("active", "reboot_started_hard") == "HARD_REBOOT"
    assert st.status_from_state("stopped", "resize_prep") == "RESIZE"
    assert st.status_from_state("resized", "resize_reverting") == "REVERT_RESIZE"
    assert st.status_from_state("soft-delete", None) == "SOFT_DELETED"
    assert st.status_from_state("bogus", None) == "UNKNOWN"


def test_power_states() -> None:
    assert st.power_state_number("running") == 1
    assert st.power_state_number("shutdown") == 4
    assert st.power_state_number(None) == 0


# Nova's API samples: project 6f70656e737461636b20342065766572 on host "compute".
NOVA_SAMPLE_HOST_ID = "2091634baaccdc4c5a1d57069c833e402921df696b7f970791b12ec6"


def test_host_id_is_novas() -> None:
    assert host_id("6f70656e737461636b20342065766572", "compute") == NOVA_SAMPLE_HOST_ID
    one = host_id("project1", "host1")
    assert len(one) == 56 and set(one) <= set("0123456789abcdef")
    assert one == host_id("project1", "host1")
    # One host, two projects: a tenant cannot tell it shares a host with another.
    assert host_id("project2", "host1") != one
    assert host_id("project1", "host2") != one
    assert host_id("project1", None) == ""
    assert host_id("project1", "") == ""


DOC: dict[str, Any] = {
    "uuid": "00000000-0000-4000-8000-000000000001",
    "display_name": "web-1",
    "tenant_id": "p1",
    "user_id": "u1",
    "state": "active",
    "task_state": None,
    "power_state": "running",
    "host": "cmp1",
    "node": "cmp1.example",
    "host_name": "web-1",
    "created_at": "2025-01-02T03:04:05.678901Z",
    "updated_at": None,
    "launched_at": "2025-01-02T03:05:00Z",
    "flavor_flavorid": "2",
    "flavor_name": "m1.small",
    "flavor_vcpus": 1,
    "flavor_memory_mb": 2048,
    "flavor_root_gb": 20,
    "flavor_ephemeral_gb": 0,
    "image_uuid": "img-1",
    "ip_addresses": [
        {
            "label": "private",
            "address": "10.0.0.5",
            "version": 4,
            "mac": "fa:16:3e:00:00:01",
            "meta": {},
        },
        {
            "label": "private",
            "address": "fd00::5",
            "version": 6,
            "mac": "fa:16:3e:00:00:01",
            "meta": {},
        },
    ],
    "tags": ["prod"],
    "locked": True,
    "block_devices": [{"volume_id": "vol-1", "delete_on_termination": True}],
}


def ctx(version: str = "2.1", admin: bool = False, project: str | None = None) -> LinkContext:
    major, minor = version.split(".")
    return LinkContext("http://api:8774", project, Version(int(major), int(minor)), admin)


def test_summary_and_links() -> None:
    body = summary(DOC, ctx(project="p1"))
    assert body == {
        "id": DOC["uuid"],
        "name": "web-1",
        "links": [
            {"rel": "self", "href": f"http://api:8774/v2.1/p1/servers/{DOC['uuid']}"},
            {"rel": "bookmark", "href": f"http://api:8774/p1/servers/{DOC['uuid']}"},
        ],
    }


def test_detail_keys_by_role_and_version() -> None:
    member = detail(DOC, ctx("2.1"))
    assert member["status"] == "ACTIVE" and member["progress"] == 0
    assert member["OS-EXT-STS:power_state"] == 1
    assert member["created"] == "2025-01-02T03:04:05Z"
    assert member["updated"] == member["created"]
    assert member["OS-SRV-USG:launched_at"] == "2025-01-02T03:05:00.000000"
    assert member["flavor"]["id"] == "2"
    assert [a["addr"] for a in member["addresses"]["private"]] == ["10.0.0.5", "fd00::5"]
    assert member["os-extended-volumes:volumes_attached"] == [{"id": "vol-1"}]
    assert not any(k.startswith("OS-EXT-SRV-ATTR") for k in member)
    assert "locked" not in member and "tags" not in member
    admin = detail(DOC, ctx("2.96", admin=True))
    assert admin["OS-EXT-SRV-ATTR:host"] == "cmp1"
    assert admin["OS-EXT-SRV-ATTR:hypervisor_hostname"] == "cmp1.example"
    assert admin["flavor"]["original_name"] == "m1.small" and admin["flavor"]["ram"] == 2048
    assert admin["locked"] is True and admin["tags"] == ["prod"]
    assert admin["os-extended-volumes:volumes_attached"] == [
        {"id": "vol-1", "delete_on_termination": True}
    ]
    recent_member = detail(DOC, ctx("2.90"))
    assert recent_member["OS-EXT-SRV-ATTR:hostname"] == "web-1"
    assert "OS-EXT-SRV-ATTR:host" not in recent_member


def test_next_link_keeps_repeated_parameters_in_order_and_the_marker_where_it_stood() -> None:
    link = ctx().next_link(
        "servers/detail",
        [
            ("sort_key", "display_name"),
            ("limit", "2"),
            ("sort_key", "created_at"),
            ("marker", "old"),
        ],
        "new",
    )
    # Nova's link: sorted by name, the marker replaced in its place.
    assert link == (
        "http://api:8774/v2.1/servers/detail?limit=2&marker=new&sort_key=display_name&sort_key=created_at"
    )


def test_next_link_leaves_out_what_novas_schema_strips_for_the_version() -> None:
    params = [("bogus", "1"), ("changes-before", "2000-01-01"), ("limit", "2"), ("locked", "1")]
    # Below 2.66 Nova's schema knows neither changes-before nor locked (2.73): stripped.
    assert ctx("2.1").next_link("servers", params, "m").endswith("/v2.1/servers?limit=2&marker=m")
    assert (
        ctx("2.73")
        .next_link("servers", params, "m")
        .endswith("/v2.1/servers?changes-before=2000-01-01&limit=2&locked=1&marker=m")
    )


def test_order_key_nulls_and_directions() -> None:
    docs: list[dict[str, Any]] = [
        {"uuid": "b", "display_name": None, "created_at": "2025-01-01T00:00:00.5Z"},
        {"uuid": "a", "display_name": "x", "created_at": "2025-01-01T00:00:00Z"},
        {"uuid": "c", "display_name": "x", "created_at": datetime(2025, 1, 1, 0, 0, 1, tzinfo=UTC)},
        {"uuid": "d", "display_name": "Y", "created_at": None},
    ]
    asc = (SortKey("display_name"), SortKey("uuid"))
    assert [d["uuid"] for d in sorted(docs, key=order_key(asc))] == ["b", "d", "a", "c"]
    desc = (SortKey("display_name", Direction.DESC), SortKey("uuid"))
    assert [d["uuid"] for d in sorted(docs, key=order_key(desc))] == ["a", "c", "d", "b"]
    by_time = (SortKey("created_at", Direction.DESC), SortKey("uuid"))
    assert [d["uuid"] for d in sorted(docs, key=order_key(by_time))] == ["c", "b", "a", "d"]


def test_the_latency_middleware_reads_the_path_header_by_its_name() -> None:
    from cellsight.api.headers import PATH
    from cellsight.api.metrics import PATH_HEADER

    assert PATH.lower().encode() == PATH_HEADER


@pytest.mark.parametrize("param", ["tags", "tags-any", "not-tags", "not-tags-any"])
def test_tag_filters_take_each_tag_as_written(param: str) -> None:
    """As Nova (2.26+), the value is split on commas and nothing else: a tag may begin or
    end with spaces (Nova's tag pattern allows them), and one that does is not another
    tag (the values were stripped, so ``tags=%20a`` matched tag ``a``: a probe)."""
    from cellsight.api.auth import Principal
    from cellsight.api.params import parse_list_query
    from cellsight.query.tree import Contains

    admin = Principal("u", "p", frozenset({"admin"}))
    query = parse_list_query(
        [(param, "  spaced  ,b, c")], admin, max_limit=1000, version=Version(2, 26)
    )
    contained = {node.value for node in _walk(query.filter) if isinstance(node, Contains)}
    assert contained == {"  spaced  ", "b", " c"}


def _walk(node: Any) -> list[Any]:
    """Every node of a filter tree (dataclasses holding nodes or tuples of nodes)."""
    out = [node]
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        for child in value if isinstance(value, tuple | list) else [value]:
            if dataclasses.is_dataclass(child):
                out.extend(_walk(child))
    return out
