"""Decode, validate, version and map one batch: every message gets a plan or a verdict.

Per-message isolation: whatever one message contains, this step never raises. A
contract error (:class:`NotificationError`) is a dead letter with the error's reason
code; any other exception while decoding or mapping one message (a bug, or an input
the contract did not foresee) is a dead letter with code ``internal`` naming the
exception's type and message, and its traceback is logged once per exception type and
place. The messages around it are planned as usual. Only the engine and the bus, later
in the writer and consumer, can stop the stream.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

import msgspec

from cellsight.indexer import fastmap
from cellsight.indexer.documents import (
    event_version,
    instance_document,
    node_document,
    node_version,
    snapshot_time,
)
from cellsight.indexer.engines.base import WriteOp
from cellsight.indexer.outcomes import Outcome, Verdict, dead
from cellsight.notifications.envelope import EventType, decode
from cellsight.notifications.errors import NotificationError, OutOfRange
from cellsight.notifications.fastdecode import decode_fast
from cellsight.notifications.limits import LONG_MAX, LONG_MIN
from cellsight.notifications.objects import NODE_OBJECT, ComputeNodePayload
from cellsight.notifications.payloads import GenericPayload, InstancePayload

log = logging.getLogger(__name__)

INTERNAL = "internal"
_logged_internal: set[tuple[str, str]] = set()


class EventInfo(NamedTuple):
    """What the writer needs of a notification after it was mapped."""

    event_type: str
    timestamp: datetime | None


class Planned(msgspec.Struct):
    """A Struct: one per notification in each of the indexer's processes, at a third of
    a slotted dataclass's construction cost."""

    position: int
    op: WriteOp
    notification: EventInfo
    snapshot_at: datetime | None


def plan(bodies: Sequence[Any]) -> tuple[list[Outcome | None], list[Planned]]:
    """Decode and map a batch. Pure: no engine, no bus. Unplanned positions are final."""
    outcomes: list[Outcome | None] = [None] * len(bodies)
    planned: list[Planned] = []
    indexed_at = fastmap.now()
    for i, body in enumerate(bodies):
        try:
            result = plan_one(i, body, indexed_at)
        except NotificationError as exc:
            outcomes[i] = dead(exc.reason, f"{type(exc).__name__}: {exc.message}", exc.event_type)
            continue
        except Exception as exc:
            outcomes[i] = internal_error(exc)
            continue
        if isinstance(result, Planned) and not LONG_MIN <= result.op.version <= LONG_MAX:
            outcomes[i] = dead(
                OutOfRange.reason,
                f"{result.notification.event_type}: version {result.op.version} derived from "
                "the snapshot's times does not fit a 64-bit long (times after 2255)",
                result.notification.event_type,
            )
        elif isinstance(result, Planned):
            planned.append(result)
        else:
            outcomes[i] = result
    return outcomes, planned


def internal_error(exc: BaseException) -> Outcome:
    """The dead letter of an unexpected exception; its traceback is logged once per
    (type, place), so a flood of one poison kind does not flood the log."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
    key = (type(exc).__name__, where)
    if key not in _logged_internal:
        _logged_internal.add(key)
        log.error("unexpected %s while decoding a message", type(exc).__name__, exc_info=exc)
    return dead(INTERNAL, f"{type(exc).__name__}: {str(exc)[:500]}")


# A tuple, built once: ``bytes | str ...`` in the call would build a union per message.
_RAW = (bytes, bytearray, memoryview, str)


def plan_one(position: int, body: Any, indexed_at: str | None = None) -> Planned | Outcome:
    if isinstance(body, _RAW):
        fast = plan_fast(position, body, indexed_at)
        if fast is not None:
            return fast
    n = decode(body)
    payload, event = n.payload, n.event
    info = EventInfo(n.event_type, n.timestamp)
    return map_payload(position, payload, event, info)


def map_payload(
    position: int, payload: Any, event: EventType, info: EventInfo
) -> Planned | Outcome:
    if event.object == NODE_OBJECT:
        if not isinstance(payload, ComputeNodePayload):
            return not_a_node(info.event_type, payload)
        version = node_version(payload)
        op = WriteOp("node", payload.uuid, version, node_document(payload, version))
        return Planned(position, op, info, payload.updated_at)
    if event.object != "instance":
        return Outcome(Verdict.IGNORED, event_type=info.event_type)
    if not isinstance(payload, InstancePayload):
        # A class read by its name (a flavor's, an address's) is not read for instance
        # fields, whatever else its data holds; only an unknown name is read by shape.
        why = (
            "does not carry the InstancePayload fields"
            if isinstance(payload, GenericPayload)
            else "names a class of Nova's that is not an instance snapshot"
        )
        return dead(
            "not_an_instance",
            f"{info.event_type}: payload {payload.obj_name} {payload.obj_version} {why}",
            info.event_type,
        )
    version = event_version(payload, event, info.timestamp)
    doc = instance_document(payload, info.event_type, version)
    op = WriteOp("instance", payload.uuid, version, doc)
    return Planned(position, op, info, snapshot_time(payload))


def not_a_node(event_type: str, payload: Any) -> Outcome:
    """A node event whose payload is another class: dead-lettered, as an instance event's
    is (acked and counted as ignored, it vanished with nothing to find it by). Named with
    its namespace: a ComputeNodePayload of Nova's namespace is not Cellsight's (a probe:
    "payload ComputeNodePayload 1.0 is not a ComputeNodePayload")."""
    ours = f"{ComputeNodePayload.OBJ_NAMESPACE}.{ComputeNodePayload.OBJ_NAME}"
    theirs = f"{payload.obj_namespace}.{payload.obj_name} {payload.obj_version}"
    return dead("not_a_node", f"{event_type}: payload {theirs} is not a {ours}", event_type)


def plan_fast(position: int, body: Any, indexed_at: str | None = None) -> Planned | Outcome | None:
    """The compiled path; None when it declines (the reference decides then)."""
    try:
        n = decode_fast(body)
    except Exception:
        return None
    info = EventInfo(n.event_type, n.timestamp)
    if n.event.object == NODE_OBJECT:
        if n.payload_class is not ComputeNodePayload:
            return None  # the reference names the class it read
        version, doc = fastmap.node_document(n, indexed_at)
        return Planned(
            position, WriteOp("node", n.data.uuid, version, doc), info, n.data.updated_at
        )
    if n.payload_class is ComputeNodePayload:
        return None  # a node's payload on another object's event: the reference decides
    if n.event.object != "instance":
        return Outcome(Verdict.IGNORED, event_type=info.event_type)
    version, snapshot = fastmap.instance_version(n)
    doc = fastmap.instance_document(n, version, indexed_at)
    op = WriteOp("instance", n.data.uuid, version, doc)
    return Planned(position, op, info, snapshot)
