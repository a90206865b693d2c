"""Who acts, what a boot asks for, and the row a boot writes."""

from __future__ import annotations

import hashlib
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cellsight.cells.errors import InvalidTag
from cellsight.cells.rows import InstanceRow, payload_to_row
from cellsight.cells.text_rules import check_given
from cellsight.notifications import limits
from cellsight.notifications.errors import clip
from cellsight.notifications.forms import TAG_FORBIDDEN, tag_problem
from cellsight.notifications.objects import Selection
from cellsight.notifications.payloads import (
    FlavorPayload,
    InstanceCreatePayload,
    IpPayload,
    KeypairPayload,
)

DEFAULT_IMAGE = "155d900f-4e14-4e4c-a73d-069cbf4541e6"


@dataclass(frozen=True)
class Actor:
    """The caller of an operation. Non-admins see only their project's instances and
    cannot act on locked ones (except to lock and unlock)."""

    project_id: str | None = None
    user_id: str | None = None
    is_admin: bool = True
    request_id: str | None = None

    def may_see(self, row: Mapping[str, Any]) -> bool:
        return self.is_admin or self.project_id is None or row["project_id"] == self.project_id


ADMIN = Actor()


def check_tags(tags: Sequence[str]) -> list[str]:
    """``tags`` as a set, sorted, or ``InvalidTag``: Nova's rules for server tags, the
    notification contract's (``forms.tag_problem``)."""
    unique = sorted(set(tags))
    if len(unique) > limits.MAX_TAGS:
        raise InvalidTag(f"{len(unique)} tags, at most {limits.MAX_TAGS}")
    for tag in unique:
        if tag_problem(tag) is not None:
            raise InvalidTag(
                f"{clip(tag, 70)!r}: a tag is 1 to {limits.TAG_LENGTH} characters "
                f"without {' or '.join(map(repr, TAG_FORBIDDEN))}"
            )
    return unique


@dataclass
class BootRequest:
    display_name: str
    flavor: str
    project_id: str
    user_id: str
    image_ref: str = DEFAULT_IMAGE
    count: int = 1
    cell: str | None = None
    availability_zone: str | None = None
    key_name: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    description: str | None = None
    os_type: str | None = "linux"
    architecture: str | None = "x86_64"
    uuids: list[str] | None = None  # given by the caller (idempotent retries, tests)

    def instance_uuids(self) -> list[str]:
        check_tags(self.tags)
        if self.count < 1:
            raise ValueError(f"count must be at least 1, got {self.count}")
        check_given(
            name=self.display_name,
            project_id=self.project_id,
            user_id=self.user_id,
            key_name=self.key_name,
            availability_zone=self.availability_zone,
            image=self.image_ref,
            cell=self.cell,
        )
        if self.uuids is None:
            return [str(uuidlib.uuid4()) for _ in range(self.count)]
        if len(self.uuids) != self.count:
            raise ValueError(f"{len(self.uuids)} uuids given for count {self.count}")
        try:
            return [str(uuidlib.UUID(u)) for u in self.uuids]
        except ValueError:
            raise ValueError(f"not a UUID among {self.uuids}") from None


def _ip(uuid: str, cell_uuid: str) -> IpPayload:
    # A stable private address per instance; a real deployment asks the network service.
    digest = hashlib.sha256(uuid.encode()).digest()
    port = str(uuidlib.UUID(bytes=digest[:16], version=4))
    return IpPayload(
        label="private",
        mac="fa:16:3e:{:02x}:{:02x}:{:02x}".format(*digest[16:19]),
        port_uuid=port,
        version=4,
        address=f"10.{int(cell_uuid[:2], 16)}.{digest[19]}.{digest[20] or 1}",
        device_name=f"tap{port[:11]}",
    )


def host_name_of(name: str) -> str:
    """An instance's host name from its display name (set once, at create)."""
    return name.lower().replace(" ", "-")


def new_instance_row(
    request: BootRequest,
    flavor: dict[str, Any],
    uuid: str,
    index: int,
    selection: Selection,
    actor: Actor,
    now: datetime,
) -> InstanceRow:
    """The ``instances`` row of a freshly built instance (active, running, revision 1)."""
    name = request.display_name if request.count == 1 else f"{request.display_name}-{index + 1}"
    payload = InstanceCreatePayload(
        uuid=uuid,
        user_id=request.user_id,
        tenant_id=request.project_id,
        reservation_id=f"r-{uuid[:8]}",
        display_name=name,
        display_description=request.description,
        host_name=host_name_of(name),
        host=selection.service_host,
        node=selection.nodename,
        os_type=request.os_type,
        architecture=request.architecture,
        availability_zone=selection.availability_zone or request.availability_zone,
        flavor=FlavorPayload.model_validate(flavor),
        image_uuid=request.image_ref,
        key_name=request.key_name,
        kernel_id="",
        ramdisk_id="",
        created_at=now,
        launched_at=now,
        updated_at=now,
        state="active",
        power_state="running",
        task_state=None,
        progress=0,
        ip_addresses=[_ip(uuid, selection.cell_uuid)],
        block_devices=[],
        metadata=dict(request.metadata),
        auto_disk_config="MANUAL",
        locked=False,
        request_id=actor.request_id or f"req-{uuidlib.uuid4()}",
        action_initiator_project=actor.project_id or request.project_id,
        action_initiator_user=actor.user_id or request.user_id,
        shares=[],
        keypairs=[KeypairPayload(user_id=request.user_id, name=request.key_name, type="ssh")]
        if request.key_name
        else [],
        tags=sorted(set(request.tags)),
        instance_name=f"instance-{uuid[:8]}",
        revision=1,
        forthcoming=False,
    )
    return payload_to_row(payload)
