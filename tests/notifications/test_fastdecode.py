"""The compiled decoder is generated from the payload models: same fields, same
defaults, bounds from ``cellsight.notifications.limits``; realistic notifications take it.

Nova's other instance classes read by shape and the versions it decides on:
``test_fastdecode_shapes``; the oslo wrapper, a body's buffer and times:
``test_fastdecode_wire``."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellsight.indexer.planning import Planned, plan_fast
from cellsight.notifications import base, envelope, fastdecode, limits
from cellsight.notifications.fastdecode import FAST_CLASSES, decode_fast
from cellsight.notifications.payloads import InstancePayload
from tests.support import novagen


@pytest.mark.parametrize("model", FAST_CLASSES, ids=lambda m: m.__name__)
def test_structs_have_the_models_fields_and_defaults(model: type[base.VersionedObject]) -> None:
    struct = next(s for s, m in fastdecode._TOPS.items() if m is model)
    data = next(f.type for f in msgspec.structs.fields(struct) if f.name == "data")
    fields = {f.name: f for f in msgspec.structs.fields(data)}
    # Every field, in the order Nova sends the keys (found at msgspec's first look).
    assert list(fields) == list(model.wire_order())
    assert set(fields) == set(model.model_fields)
    for name, info in model.model_fields.items():
        f = fields[name]
        if info.is_required():
            assert f.required, name
        elif info.default_factory is not None:
            assert f.default_factory() == info.default_factory(), name  # type: ignore[call-arg]
        else:
            assert f.default == info.default, name


# Nova's field order (``nova/notifications/objects/instance.py``, each class's ``fields``),
# which oslo.versionedobjects' ``obj_to_primitive`` walks: a class's own, then its base's.
NOVA_INSTANCE = [
    "uuid",
    "user_id",
    "tenant_id",
    "reservation_id",
    "display_name",
    "display_description",
    "host_name",
    "host",
    "node",
    "os_type",
    "architecture",
    "availability_zone",
    "flavor",
    "image_uuid",
    "key_name",
    "kernel_id",
    "ramdisk_id",
    "created_at",
    "launched_at",
    "terminated_at",
    "deleted_at",
    "updated_at",
    "state",
    "power_state",
    "task_state",
    "progress",
    "ip_addresses",
    "block_devices",
    "metadata",
    "locked",
    "auto_disk_config",
    "request_id",
    "action_initiator_user",
    "action_initiator_project",
    "locked_reason",
    "shares",
]
NOVA_OWN = {
    "InstanceActionPayload": ["fault", "request_id"],
    "InstanceCreatePayload": ["keypairs", "tags", "trusted_image_certificates", "instance_name"],
    "InstanceUpdatePayload": ["state_update", "audit_period", "old_display_name", "tags"],
}


@pytest.mark.parametrize("model", FAST_CLASSES[:4], ids=lambda m: m.__name__)
def test_the_wire_order_is_novas(model: type[base.VersionedObject]) -> None:
    expected: list[str] = []
    for cls in reversed(model.__mro__):  # the base first: each class puts its own before
        own = NOVA_OWN.get(cls.__name__, NOVA_INSTANCE if cls is InstancePayload else [])
        expected = [*own, *(name for name in expected if name not in own)]
    order = list(model.wire_order())
    assert order[: len(expected)] == expected
    assert set(order[len(expected) :]) == {"revision", "cell_uuid", "forthcoming", "tags"} - set(
        expected
    )


def _key_orders(sent: Any, received: Any, path: str = "") -> list[tuple[str, list[str], list[str]]]:
    """The keys two wire values share, in each one's order, for every dict in them."""
    if isinstance(sent, list) and isinstance(received, list):
        pairs = zip(sent, received, strict=False)
        return [o for n, (a, b) in enumerate(pairs) for o in _key_orders(a, b, f"{path}[{n}]")]
    if not (isinstance(sent, dict) and isinstance(received, dict)):
        return []
    orders = [
        (
            path,
            [key for key in sent if key in received],
            [key for key in received if key in sent],
        )
    ]
    for key in sent.keys() & received.keys():
        orders += _key_orders(sent[key], received[key], f"{path}.{key}")
    return orders


@pytest.mark.parametrize("kind", sorted(novagen.EVENT_CLASSES))
def test_cellsight_sends_novas_order(kind: str) -> None:
    """What Cellsight's producer serialises puts every versioned object's keys, nested
    ones and those of classes read by shape included, in the order Nova sends them (the
    generated notification's, held to Nova's field lists above): its fast decode is the
    consumers' too."""
    nova = novagen.notification(kind, seed=5)["payload"]
    ours = envelope.decode(novagen.body(novagen.notification(kind, seed=5))).payload
    orders = _key_orders(nova, ours.to_primitive())
    assert len(orders) > 1
    for path, sent, received in orders:
        assert received == sent, path
    # A class read by shape (instance.exists' InstanceExistsPayload as an InstancePayload)
    # has fields the model does not know: the class's own, which oslo sends first.
    data = list(ours.to_primitive()[base.DATA])
    unknown = [key for key in data if key not in type(ours).model_fields]
    assert data[: len(unknown)] == unknown


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**16), order=st.randoms(use_true_random=False))
def test_the_key_order_changes_nothing(seed: int, order: Any) -> None:
    """Nova's order is the fast one; any other order decodes to the same document."""
    kinds = sorted(novagen.EVENT_CLASSES)
    notification = novagen.notification(kinds[seed % len(kinds)], seed=seed)
    data = notification["payload"]["nova_object.data"]
    keys = list(data)
    shuffled = dict(notification, payload=dict(notification["payload"]))
    order.shuffle(keys)
    shuffled["payload"]["nova_object.data"] = {k: data[k] for k in keys}
    one, other = (plan_fast(0, novagen.body(n)) for n in (notification, shuffled))
    assert isinstance(one, Planned) and isinstance(other, Planned)
    assert dict(one.op.document, indexed_at=None) == dict(other.op.document, indexed_at=None)


@pytest.mark.parametrize("name", sorted(novagen.sample_set()))
@pytest.mark.parametrize("wrapped", [True, False])
def test_realistic_notifications_take_the_compiled_path(name: str, wrapped: bool) -> None:
    body = novagen.body(novagen.sample_set()[name], wrapped=wrapped)
    result = plan_fast(0, body)
    if name == "service-update":
        assert result is None  # a class read verbatim: the reference decides
    else:
        assert isinstance(result, Planned), name


def test_bounds_come_from_the_limits() -> None:
    body = novagen.notification(seed=3)
    body["payload"]["nova_object.data"]["display_name"] = "n" * limits.NAME_LENGTH
    assert decode_fast(novagen.body(body)).data.display_name == "n" * limits.NAME_LENGTH
    body["payload"]["nova_object.data"]["display_name"] += "n"
    with pytest.raises(msgspec.ValidationError, match="display_name"):
        decode_fast(novagen.body(body))
