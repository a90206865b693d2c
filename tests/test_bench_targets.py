"""The benchmarks' target verdicts (``scripts/bench/targets.py``): a missed target is
called beyond the machine's limit only when the limit measured beside it is itself
short of the threshold."""

from __future__ import annotations

import pytest

from scripts.bench.targets import summary, target


def test_met_and_missed_without_a_limit() -> None:
    assert target("rate", 7000, 6500)["status"] == "met"
    missed = target("rate", 6000, 6500)
    assert (missed["pass"], missed["status"]) == (False, "missed")
    assert "limit" not in missed
    assert target("lag", 0.5, 1.0, "<=")["status"] == "met"
    assert target("lag", 1.5, 1.0, "<=")["status"] == "missed"


def test_a_limit_short_of_the_threshold_explains_a_miss() -> None:
    t = target("ceiling", 15_000, 25_000, limit=(16_000, "floor"))
    assert t["status"] == "beyond_limit"
    assert t["limit"] == {
        "value": 16_000,
        "set_by": "floor",
        "threshold_beyond_limit": True,
        "share_of_limit": 0.938,
    }


def test_a_limit_above_the_threshold_leaves_the_miss_a_miss() -> None:
    t = target("ceiling", 20_000, 25_000, limit=(30_000, "floor"))
    assert t["status"] == "missed"
    assert t["limit"]["threshold_beyond_limit"] is False
    # Met stays met, whatever the limit says.
    assert target("ceiling", 26_000, 25_000, limit=(20_000, "floor"))["status"] == "met"
    # For an upper bound, a limit above the threshold is the one that stops it.
    assert target("rss", 350, 300, "<=", limit=(320, "x"))["status"] == "beyond_limit"


def test_summary_groups_names_by_status() -> None:
    found = [
        {"engine": "embedded", **target("rate", 7000, 6500)},
        {"engine": "embedded", **target("ceiling", 15_000, 25_000, limit=(16_000, "floor"))},
        target("decode", 30, 25, "<="),
    ]
    assert summary(found) == {
        "all_pass": False,
        "by_status": {
            "met": ["embedded: rate"],
            "beyond_limit": ["embedded: ceiling"],
            "missed": ["decode"],
        },
    }
    assert summary([target("rate", 7000, 6500)])["all_pass"] is True


def test_a_limit_the_value_passed_did_not_bind() -> None:
    # The code outran its "limit": that limit did not stop it, so the miss is a miss.
    t = target("ceiling", 20_000, 25_000, limit=(18_000, "floor"))
    assert (t["status"], t["limit"]["threshold_beyond_limit"]) == ("missed", True)
    assert target("rss", 310, 300, "<=", limit=(320, "x"))["status"] == "missed"


def test_only_the_two_comparisons() -> None:
    with pytest.raises(ValueError, match="op must be"):
        target("x", 1, 2, ">")


def test_no_targets_is_not_a_pass() -> None:
    assert summary([])["all_pass"] is False
