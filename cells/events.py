"""Nova's notification sequences for the cluster operations, built from committed rows.

An action with phases emits ``instance.<action>.start`` (the snapshot before the
change, with the transitional task state Nova shows, e.g. ``powering-off``),
``instance.update`` when the state changed (``InstanceUpdatePayload`` with
``state_update``), then ``instance.<action>.end`` (the committed snapshot). Actions
without phases (``lock``/``unlock``) emit ``instance.<action>``; field edits (rename,
metadata, tags) emit ``instance.update`` only, as Nova does.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from cellsight.cells.actions import Action
from cellsight.cells.rows import action_payload, create_payload, update_payload
from cellsight.notifications.envelope import Notification
from cellsight.notifications.payloads import AuditPeriodPayload, InstanceStateUpdatePayload

Row = Mapping[str, Any]


def audit_period(now: datetime) -> AuditPeriodPayload:
    # Nova's default audit period is the current month.
    return AuditPeriodPayload(
        audit_period_beginning=now.replace(day=1, hour=0, minute=0, second=0, microsecond=0),
        audit_period_ending=now,
    )


def state_update(before: Row, after: Row, old_task_state: str | None) -> InstanceStateUpdatePayload:
    return InstanceStateUpdatePayload(
        old_state=before.get("vm_state"),
        state=after.get("vm_state"),
        old_task_state=old_task_state,
        new_task_state=after.get("task_state"),
    )


def _state_changed(before: Row, after: Row, old_task_state: str | None) -> bool:
    return (
        before.get("vm_state") != after.get("vm_state")
        or before.get("power_state") != after.get("power_state")
        or old_task_state != after.get("task_state")
    )


def instance_update(
    before: Row,
    after: Row,
    cell_uuid: str,
    publisher_id: str,
    now: datetime,
    old_task_state: str | None,
) -> Notification:
    payload = update_payload(
        after,
        cell_uuid,
        state_update=state_update(before, after, old_task_state),
        audit_period=audit_period(now),
        old_display_name=(
            before.get("display_name")
            if before.get("display_name") != after.get("display_name")
            else None
        ),
    )
    return Notification.create("instance.update", publisher_id, payload)


def action_events(
    action: Action, before: Row, after: Row, cell_uuid: str, publisher_id: str, now: datetime
) -> list[Notification]:
    if action.update_only:
        return [
            instance_update(before, after, cell_uuid, publisher_id, now, before.get("task_state"))
        ]
    if not action.phases:
        return [
            Notification.create(
                f"instance.{action.name}", publisher_id, action_payload(after, cell_uuid)
            )
        ]
    old_task = action.task_state or before.get("task_state")
    start_row = {**before, "task_state": old_task}
    events = [
        Notification.create(
            f"instance.{action.name}.start", publisher_id, action_payload(start_row, cell_uuid)
        )
    ]
    if _state_changed(before, after, old_task):
        events.append(instance_update(before, after, cell_uuid, publisher_id, now, old_task))
    events.append(
        Notification.create(
            f"instance.{action.name}.end", publisher_id, action_payload(after, cell_uuid)
        )
    )
    return events


def create_events(
    after: Row, cell_uuid: str, publisher_id: str, now: datetime
) -> list[Notification]:
    """``instance.create.start`` (the build request: revision 0, no host yet),
    ``instance.update`` (building → active), ``instance.create.end``."""
    building = {
        **after,
        "vm_state": "building",
        "power_state": "pending",
        "task_state": None,
        "host": None,
        "node": None,
        "launched_at": None,
        "revision": 0,
    }
    return [
        Notification.create(
            "instance.create.start", publisher_id, create_payload(building, cell_uuid)
        ),
        instance_update(building, after, cell_uuid, publisher_id, now, "spawning"),
        Notification.create("instance.create.end", publisher_id, create_payload(after, cell_uuid)),
    ]
