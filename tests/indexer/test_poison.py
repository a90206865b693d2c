"""Per-message isolation: every poison kind is a dead letter with its reason, whatever
it contains; the messages around it are planned; the contract's edge values are indexed.

The decode step (``cellsight.indexer.planning.plan``) is what the consumer calls for each batch;
the end-to-end runs through the consumer on the real buses are in
``test_poison_bus.py``.
"""

from __future__ import annotations

import logging
import tracemalloc

import pytest

from cellsight.indexer.outcomes import Verdict
from cellsight.indexer.planning import INTERNAL, Planned, plan
from cellsight.notifications.envelope import decode
from cellsight.notifications.errors import NotificationError
from tests.support import novagen, poison

CORPUS = poison.corpus()
ACCEPTED = poison.accepted()
# Decided after decoding, by the indexer (the notification itself is well formed).
PLAN_LEVEL = {"not_an_instance", "version_past_2255"}


def test_the_corpus_has_at_least_thirty_kinds() -> None:
    assert len(CORPUS) >= 30
    assert len({code for _, code in CORPUS.values()}) >= 6


@pytest.mark.parametrize("kind", sorted(set(CORPUS) - PLAN_LEVEL))
def test_decode_raises_the_named_error(kind: str) -> None:
    body, code = CORPUS[kind]
    with pytest.raises(NotificationError) as caught:
        decode(body)
    assert caught.value.reason == code, caught.value.message
    assert len(caught.value.message) < 2000  # a reason, not a copy of the input


def test_each_poison_is_dead_between_good_messages() -> None:
    bodies: list[bytes] = []
    expected: list[str | None] = []
    for i, (body, code) in enumerate(CORPUS.values()):
        bodies += [novagen.body(poison.good(seed=1000 + i)), body]
        expected += [None, code]
    outcomes, planned = plan(bodies)
    assert {p.position for p in planned} == {i for i, e in enumerate(expected) if e is None}
    for kind, position in zip(CORPUS, range(1, len(bodies), 2), strict=True):
        outcome = outcomes[position]
        assert outcome is not None and outcome.verdict is Verdict.DEAD, kind
        assert outcome.reason_code == expected[position], (kind, outcome.reason)
        assert outcome.reason


@pytest.mark.parametrize("kind", sorted(ACCEPTED))
def test_edge_values_the_contract_allows_are_indexed(kind: str) -> None:
    body, uuid = ACCEPTED[kind]
    outcomes, planned = plan([body])
    assert outcomes == [None]
    (p,) = planned
    assert p.op.id == uuid
    doc = p.op.document
    if kind == "nul_in_string":
        assert doc["display_name"] == "nul\x00inside"
    if kind == "duplicate_keys":
        assert doc["display_name"] == "last"
    if kind == "naive_times":
        assert doc["updated_at"] == "2024-05-02T10:00:00Z"
        assert doc["created_at"] == "2024-05-01T09:00:00Z"
    if kind == "offset_times":
        assert doc["updated_at"] == "2024-05-02T04:30:00Z"
    if kind == "long_max":
        assert doc["flavor_memory_mb"] == 2**63 - 1


@pytest.mark.parametrize("kind", ["updated_at_leap_second", "envelope_timestamp_leap_second"])
def test_a_leap_second_is_named_as_one(kind: str) -> None:
    """The parsers' own words for second 60 were "unexpected extra characters" (the
    payload's) and "not an ISO 8601 time" (the envelope's): both wrong about the input."""
    outcomes, planned = plan([CORPUS[kind][0]])
    (outcome,) = outcomes
    assert planned == [] and outcome is not None and outcome.verdict is Verdict.DEAD
    assert outcome.reason is not None
    assert "a leap second (second 60)" in outcome.reason, outcome.reason
    assert "extra characters" not in outcome.reason and "not an ISO" not in outcome.reason


def test_second_60_of_an_invalid_date_is_not_blamed_on_the_leap_second() -> None:
    """A review: month 13 with second 60 was refused as "a leap second", its month unnamed."""
    outcomes, planned = plan([CORPUS["updated_at_month_13_second_60"][0]])
    (outcome,) = outcomes
    assert planned == [] and outcome is not None and outcome.verdict is Verdict.DEAD
    assert outcome.reason is not None and "updated_at" in outcome.reason, outcome.reason
    assert "leap second" not in outcome.reason, outcome.reason


class ExplodingBody(bytes):
    """A body whose length cannot be taken: an exception no contract rule names."""

    def __len__(self) -> int:
        raise RuntimeError("the body exploded")


def test_an_unexpected_exception_is_an_internal_dead_letter_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = [novagen.body(poison.good(seed=s)) for s in (1, 2, 3)]
    bodies = [good[0], ExplodingBody(b"{}"), good[1], ExplodingBody(b"[]"), good[2]]
    with caplog.at_level(logging.ERROR, logger="cellsight.indexer.planning"):
        outcomes, planned = plan(bodies)
    assert [p.position for p in planned] == [0, 2, 4]
    for i in (1, 3):
        outcome = outcomes[i]
        assert outcome is not None and outcome.verdict is Verdict.DEAD
        assert outcome.reason_code == INTERNAL
        assert outcome.reason == "RuntimeError: the body exploded"
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) <= 1  # once per (type, place), even across tests
    assert all("RuntimeError" in r.getMessage() for r in tracebacks)


def test_memory_stays_flat_over_repeated_poison() -> None:
    bodies = [b for b, _ in CORPUS.values() if len(b) < 1_000_000]
    bodies += [novagen.body(poison.good(seed=s)) for s in range(20)]
    plan(bodies)  # warm caches (lru of event types, struct plans)
    tracemalloc.start()
    try:
        plan(bodies)
        first, _ = tracemalloc.get_traced_memory()
        for _ in range(10):
            outcomes, planned = plan(bodies)
            del outcomes, planned
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - first < 512 * 1024, (first, after)


def test_planned_documents_carry_the_batch_indexed_at() -> None:
    _, planned = plan([novagen.body(poison.good(seed=s)) for s in range(3)])
    stamps = {p.op.document["indexed_at"] for p in planned}
    assert len(stamps) == 1 and next(iter(stamps)).endswith("Z")
    assert all(isinstance(p, Planned) for p in planned)


def test_a_dead_letter_names_the_event_type_when_the_envelope_was_read() -> None:
    """An adversarial probe: a letter whose envelope was read but whose payload failed
    (a bad ``updated_at``) carried no event type, so ``dlq list`` showed "-"."""
    body = novagen.notification("instance.update", seed=5)
    body["payload"]["nova_object.data"]["updated_at"] = "not a time"
    (outcome,), planned = plan([novagen.body(body)])
    assert not planned and outcome is not None and outcome.verdict is Verdict.DEAD
    assert outcome.event_type == "instance.update", outcome
    named = 0
    for kind, (poisoned, _) in CORPUS.items():
        if kind in PLAN_LEVEL:
            continue
        with pytest.raises(NotificationError) as caught:
            decode(poisoned)
        (got,), _ = plan([poisoned])
        assert got is not None and got.event_type == caught.value.event_type, kind
        named += caught.value.event_type is not None
    assert named >= 5  # the corpus's payload-level poisons
