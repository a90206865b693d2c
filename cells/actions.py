"""The operations as notifications name them, and the states that allow each."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Action:
    """How an operation appears in notifications and which states allow it."""

    name: str
    allowed: frozenset[str] | None = None  # vm_states; None: any but deleted
    task_state: str | None = None  # the transitional task state shown in .start
    phases: bool = True  # .start/.end; False: a single instance.<name>
    update_only: bool = False  # only instance.update (edits of fields)
    lock_exempt: bool = False  # allowed on a locked instance for non-admins

    def describe(self) -> str:
        return self.name.replace("_", " ")


ANY_STATE = frozenset(
    {
        "active",
        "building",
        "stopped",
        "error",
        "paused",
        "suspended",
        "rescued",
        "resized",
        "shelved",
        "shelved_offloaded",
        "soft-delete",
    }
)
RENAME = Action("rename", update_only=True)
UPDATE_METADATA = Action("update_metadata", update_only=True)
SET_TAGS = Action("set_tags", update_only=True)
POWER_OFF = Action(
    "power_off", frozenset({"active", "error", "paused", "suspended", "rescued"}), "powering-off"
)
POWER_ON = Action("power_on", frozenset({"stopped"}), "powering-on")
REBOOT = Action("reboot", frozenset({"active"}), "rebooting")
REBOOT_HARD = Action(
    "reboot", frozenset({"active", "stopped", "error", "paused", "suspended"}), "rebooting_hard"
)
RESIZE = Action("resize", frozenset({"active", "stopped"}), "resize_prep")
LIVE_MIGRATE = Action("live_migration_post", frozenset({"active", "paused"}), "migrating")
LOCK = Action("lock", phases=False, lock_exempt=True)
UNLOCK = Action("unlock", phases=False, lock_exempt=True)
DELETE = Action("delete", ANY_STATE, "deleting")
