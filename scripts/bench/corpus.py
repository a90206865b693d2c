"""Real-size Nova notifications for the indexer benchmarks, one instance uuid each."""

from __future__ import annotations

import json
import pickle
import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cellsight.notifications.base import format_timestamp
from cellsight.notifications.registry import in_wire_order

SAMPLES = Path(__file__).resolve().parents[3] / "shared" / "nova-notification-samples"
KINDS = ("instance-create-end", "instance-update", "instance-power_off-end")

_FLAVORS = [
    ("m1.tiny", 512, 1, 1),
    ("m1.small", 2048, 1, 20),
    ("m1.medium", 4096, 2, 40),
    ("m1.large", 8192, 4, 80),
    ("c5.xlarge", 16384, 8, 100),
    ("r5.2xlarge", 65536, 8, 200),
]
_WORDS = ["web", "db", "cache", "worker", "api", "batch", "etl", "search", "queue", "proxy"]
_ENVS = ["prod", "staging", "dev", "qa"]


def wire_order(value: Any) -> Any:
    """``value`` with every versioned object's keys in the order Nova puts them on the
    wire, where the documentation samples sort them. oslo.versionedobjects'
    ``obj_to_primitive`` builds the wrapper as name, namespace, version, data (then
    changes, if any), and the data in its class's field order (``wire_order`` of the
    payload models). The order matters to a decoder: one that picks the payload's class
    by its name has to skip over data that comes first, and msgspec looks a key up
    from the field after the last one it matched."""
    if isinstance(value, list):
        return [wire_order(v) for v in value]
    if not isinstance(value, dict):
        return value
    ordered = {k: wire_order(value[k]) for k in _WIRE_KEYS if k in value}
    ordered.update((k, wire_order(v)) for k, v in value.items() if k not in ordered)
    name, data = value.get("nova_object.name"), ordered.get("nova_object.data")
    if isinstance(name, str) and isinstance(data, dict):
        ordered["nova_object.data"] = in_wire_order(name, data)
    return ordered


_WIRE_KEYS = (
    "nova_object.name",
    "nova_object.namespace",
    "nova_object.version",
    "nova_object.data",
)
STAMP = b"@@@@@@@@@@@@@@@@@@@@@@@@@@"  # as wide as oslo_time's result


def oslo_time(ts: float) -> str:
    """oslo.messaging's timestamp format, microseconds kept (26 characters)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


class Corpus:
    """Real-size Nova notifications, each about a different instance, built from the
    samples with realistic per-instance variation. ``body(i, ts)`` is the oslo-wrapped
    JSON bytes of notification ``i`` stamped ``ts`` (epoch seconds)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        # Kept as text: parsing a fresh copy is ~4x faster than copy.deepcopy.
        self.templates = [
            json.dumps(wire_order(json.loads((SAMPLES / f"{k}.json").read_text()))) for k in KINDS
        ]
        rng = random.Random(seed)
        self.projects = [rng.getrandbits(128).to_bytes(16, "big").hex() for _ in range(400)]
        self.images = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(25)]
        self.flavor_ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in _FLAVORS]
        self.base = datetime(2025, 3, 1, tzinfo=UTC)

    def instance_uuid(self, i: int) -> str:
        return str(
            uuid.UUID(int=random.Random(self.seed * 1_000_003 + i).getrandbits(128), version=4)
        )

    def notification(self, i: int, ts: float | None) -> dict[str, Any]:
        """Notification ``i``; ``ts`` None leaves ``STAMP`` in place of the timestamp."""
        rng = random.Random(self.seed * 7_919 + i)
        kind = i % len(KINDS)
        n = json.loads(self.templates[kind])
        d = n["payload"]["nova_object.data"]
        word = rng.choice(_WORDS)
        project = self.projects[rng.randrange(len(self.projects))]
        host = f"compute-{rng.randrange(300):03d}"
        name = f"{word}-{i:07d}"
        created = self.base + timedelta(seconds=i * 3, microseconds=rng.randrange(1_000_000))
        updated = created + timedelta(
            seconds=30 + rng.randrange(600), microseconds=rng.randrange(10**6)
        )
        flavor = rng.randrange(len(_FLAVORS))
        fname, mem, vcpus, disk = _FLAVORS[flavor]
        d.update(
            uuid=self.instance_uuid(i),
            display_name=name,
            display_description=f"{word} server {i} for {rng.choice(_ENVS)}",
            host_name=name,
            tenant_id=project,
            action_initiator_project=project,
            user_id=f"user-{rng.randrange(1500):04d}",
            action_initiator_user=f"user-{rng.randrange(1500):04d}",
            host=host,
            node=f"{host}.cluster.example.org",
            availability_zone=f"az-{rng.randrange(3)}",
            image_uuid=self.images[rng.randrange(len(self.images))],
            key_name=f"key-{rng.randrange(200)}",
            created_at=format_timestamp(created),
            updated_at=format_timestamp(updated),
            request_id=f"req-{uuid.UUID(int=rng.getrandbits(128), version=4)}",
            reservation_id=f"r-{rng.getrandbits(40):010x}",
            metadata={
                "env": rng.choice(_ENVS),
                "team": f"team-{rng.randrange(40)}",
                **({"backup": "daily"} if rng.random() < 0.3 else {}),
            },
        )
        if d.get("launched_at") is not None:
            d["launched_at"] = format_timestamp(created + timedelta(seconds=25))
        if "tags" in d and kind == 0:
            d["tags"] = [f"tier-{rng.randrange(3)}", rng.choice(_WORDS)]
        f = d["flavor"]["nova_object.data"]
        f.update(
            name=fname, memory_mb=mem, vcpus=vcpus, root_gb=disk, flavorid=self.flavor_ids[flavor]
        )
        for ip in d.get("ip_addresses", []):
            ipd = ip["nova_object.data"]
            ipd.update(
                address=f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}",
                mac="fa:16:3e:" + ":".join(f"{rng.randrange(256):02x}" for _ in range(3)),
                port_uuid=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                device_name=f"tap{rng.getrandbits(40):010x}"[:14],
            )
        for bdm in d.get("block_devices", []):
            bdm["nova_object.data"]["volume_id"] = str(
                uuid.UUID(int=rng.getrandbits(128), version=4)
            )
        n["publisher_id"] = f"nova-compute:{host}"
        n["message_id"] = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        # oslo.messaging's timestamp format, microseconds kept.
        n["timestamp"] = STAMP.decode() if ts is None else oslo_time(ts)
        return n

    def body(self, i: int, ts: float | None) -> bytes:
        return self.wrap(self.notification(i, ts))

    def pickle_bodies(self, count: int, path: Path) -> Path:
        """The first ``count`` bodies, stamped a millisecond apart, pickled at ``path``:
        generated once for the child processes that compare two checkouts on them."""
        path.write_bytes(pickle.dumps([self.body(i, 1.7e9 + i / 1000) for i in range(count)]))
        return path

    @staticmethod
    def wrap(notification: dict[str, Any]) -> bytes:
        inner = json.dumps(notification)
        return json.dumps({"oslo.version": "2.0", "oslo.message": inner}).encode()

    def exists(self, i: int, ts: float, audit_start: datetime, changed: bool = False) -> bytes:
        """Instance ``i`` in Nova's hourly ``instance.exists`` audit: an
        ``InstanceExistsPayload`` (InstancePayload, then the audit period and bandwidth
        per network, as Nova's ``nova/notifications/objects/instance.py`` declares it),
        built on the power_off-end sample (notification ``3i + 2``: one uuid per ``i``).
        ``changed``: the instance was updated an hour after the snapshot it has without
        it (a newer version of the same instance)."""
        n = self.notification(len(KINDS) * i + KINDS.index("instance-power_off-end"), ts)
        n["event_type"] = "instance.exists"
        payload = n["payload"]
        payload.update({"nova_object.name": "InstanceExistsPayload", "nova_object.version": "1.1"})
        data = payload["nova_object.data"]
        data.pop("fault", None)
        if changed:
            updated = datetime.fromisoformat(data["updated_at"]) + timedelta(hours=1)
            data["updated_at"] = format_timestamp(updated)
        data["audit_period"] = _wire(
            "AuditPeriodPayload",
            {
                "audit_period_beginning": format_timestamp(audit_start),
                "audit_period_ending": format_timestamp(audit_start + timedelta(hours=1)),
            },
        )
        data["bandwidth"] = [
            _wire("BandwidthPayload", {"network_name": "private", "in_bytes": i, "out_bytes": i})
        ]
        return self.wrap(wire_order(n))


def _wire(name: str, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "nova_object.name": name,
        "nova_object.namespace": "nova",
        "nova_object.version": "1.0",
        "nova_object.data": data,
    }
