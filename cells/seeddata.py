"""What seeded instances look like: projects, users, names, states, hosts, flavors, IPs.

Values are drawn column-wise for a chunk (``choices(k=n)``) and assembled into
tuples in ``instances`` column order, JSON columns as text from templates or
pre-serialised pools. Everything comes from one ``random.Random``, so a seed gives
the same rows.
"""

from __future__ import annotations

import json
import random
import uuid as uuidlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import accumulate
from typing import Any

from cellsight.cells.flavors import FLAVORS
from cellsight.cells.rows import flavor_columns
from cellsight.cells.schema import instances

EPOCH = datetime(1970, 1, 1)
SPAN_US = 730 * 86_400 * 1_000_000  # creation times spread over two years

# (vm_state, power_state, task_state, weight); Nova's payload names.
STATES: tuple[tuple[str, str, str | None, float], ...] = (
    ("active", "running", None, 74.0),
    ("active", "running", "rebooting", 0.5),
    ("active", "running", "image_snapshot", 0.5),
    ("stopped", "shutdown", None, 8.0),
    ("error", "shutdown", None, 2.0),
    ("building", "pending", "spawning", 1.0),
    ("paused", "paused", None, 1.0),
    ("suspended", "suspended", None, 1.0),
    ("shelved_offloaded", "shutdown", None, 2.0),
    ("deleted", "pending", None, 10.0),
)
NAME_PREFIXES = (
    "web",
    "db",
    "api",
    "worker",
    "cache",
    "build",
    "k8s-node",
    "etl",
    "batch",
    "vpn",
    "lb",
    "ci-runner",
    "jupyter",
    "kafka",
    "search",
    "mail",
)
ENVS = ("prod", "prod", "prod", "staging", "dev", "test")
UNICODE_NAMES = ("données", "サーバー", "сервер", "Ünïcødé", "服务器", "Zürich-Ω")
TAG_POOL = (
    "prod",
    "staging",
    "dev",
    "team-a",
    "team-b",
    "team-c",
    "pci",
    "gpu",
    "backup",
    "k8s",
    "legacy",
    "monitored",
)
FLAVOR_WEIGHTS = {
    "m1.tiny": 10,
    "m1.small": 30,
    "m1.medium": 28,
    "m1.large": 15,
    "m1.xlarge": 8,
    "c1.large": 4,
    "r1.large": 4,
    "g1.xlarge": 1,
}
AZS = ("az1", "az2", "az3")
IP_PRIVATE = (
    '{"label": "private", "mac": "fa:16:3e:%02x:%02x:%02x", "meta": {}, '
    '"port_uuid": "%s", "version": 4, "address": "10.%d.%d.%d", '
    '"device_name": "tap%s"}'
)
IP_PUBLIC = (
    '{"label": "public", "mac": "fa:16:3e:%02x:%02x:%02x", "meta": {}, '
    '"port_uuid": null, "version": 6, "address": "2001:db8:%x::%x", '
    '"device_name": null}'
)
BDM = (
    '[{"device_name": "/dev/vda", "boot_index": 0, "delete_on_termination": true, '
    '"volume_id": "%s", "tag": null}]'
)

COLUMNS: tuple[str, ...] = tuple(c.name for c in instances.columns if c.name != "id")


def _cum(weights: list[float]) -> list[float]:
    return list(accumulate(weights))


def _uuid(rng: random.Random) -> str:
    return str(uuidlib.UUID(int=rng.getrandbits(128), version=4))


@dataclass
class HostUsage:
    vcpus: int = 0
    memory_mb: int = 0
    local_gb: int = 0


PROJECTS = 40


def _shared(seed: int) -> random.Random:
    """What every cell of one seed draws alike: projects, users, keypairs, images."""
    return random.Random(f"cellsight-seed:{seed}:shared")


def _projects(shared: random.Random) -> list[str]:
    return [shared.getrandbits(128).to_bytes(16).hex() for _ in range(PROJECTS)]


def seeded_projects(seed: int) -> list[str]:
    """The projects of a seed's instances, largest first (project i holds a share of the
    instances proportional to 1 / (i + 1))."""
    return _projects(_shared(seed))


class Generator:
    """Rows for one cell. Projects, users and images are shared by all cells of a seed."""

    def __init__(
        self,
        rng: random.Random,
        *,
        seed: int,
        cell_index: int,
        cell_name: str,
        now: datetime,
        instances: int,
    ) -> None:
        self.rng = rng
        self.columns = COLUMNS
        self.cell_index = cell_index
        self.now_us = int(
            (now.astimezone(UTC).replace(tzinfo=None) - EPOCH) / timedelta(microseconds=1)
        )
        self.now = now.astimezone(UTC).replace(tzinfo=None)
        self.seq = 0
        shared = _shared(seed)
        self.projects = _projects(shared)
        self.project_cum = _cum([1.0 / (i + 1) for i in range(PROJECTS)])  # a few big tenants
        self.users = [
            [shared.getrandbits(64).to_bytes(8).hex() for _ in range(shared.randint(1, 6))]
            for _ in range(PROJECTS)
        ]
        self.keypairs = {
            user: json.dumps(
                [
                    {
                        "user_id": user,
                        "name": f"key-{user[:6]}",
                        "type": "ssh",
                        "public_key": f"ssh-ed25519 AAAAC3Nza{user} seed",
                        "fingerprint": ":".join(user[i : i + 2] for i in range(0, 16, 2)),
                    }
                ]
            )
            for users in self.users
            for user in users
        }
        self.images = [_uuid(shared) for _ in range(12)]
        n_hosts = max(2, min(5000, instances // 40))
        self.hosts = [f"{cell_name}-cmp{h:04d}" for h in range(n_hosts)]
        self.host_az = [AZS[h % len(AZS)] for h in range(n_hosts)]
        self.flavor_names = list(FLAVOR_WEIGHTS)
        self.flavor_cum = _cum([float(w) for w in FLAVOR_WEIGHTS.values()])
        self.flavor_json = [json.dumps(FLAVORS[f]) for f in self.flavor_names]
        self.flavor_cols = [flavor_columns(FLAVORS[f]) for f in self.flavor_names]
        self.state_cum = _cum([s[3] for s in STATES])
        tag_sets = [
            sorted(rng.sample(TAG_POOL, k)) for k in (0, 0, 0, 1, 1, 1, 2, 2, 3) for _ in range(4)
        ]
        self.tag_json = [json.dumps(t) for t in tag_sets]
        self.meta_json = ["{}", "{}", "{}"] + [
            json.dumps(
                {"env": env, "owner": f"team-{t}", **({"backup": "daily"} if t == "a" else {})}
            )
            for env in ("prod", "staging", "dev")
            for t in "abc"
        ]

    def instances(
        self, n: int, usage: dict[str, HostUsage], *, dates_as_text: bool
    ) -> list[tuple[Any, ...]]:
        rng, choices, rand = self.rng, self.rng.choices, self.rng.random
        projects = choices(range(len(self.projects)), cum_weights=self.project_cum, k=n)
        states = choices(STATES, cum_weights=self.state_cum, k=n)
        flavors = choices(range(len(self.flavor_names)), cum_weights=self.flavor_cum, k=n)
        hosts = choices(range(len(self.hosts)), k=n)
        prefixes = choices(NAME_PREFIXES, k=n)
        envs = choices(ENVS, k=n)
        tags = choices(self.tag_json, k=n)
        metas = choices(self.meta_json, k=n)
        images = choices(self.images, k=n)
        cell, now_us = self.cell_index % 256, self.now_us
        rows: list[tuple[Any, ...]] = []
        for i in range(n):
            bits = rng.getrandbits(128)
            h = f"{bits:032x}"
            uuid = f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[bits >> 62 & 3]}{h[17:20]}-{h[20:]}"
            port = f"{h[24:]}-{h[16:20]}-4{h[1:4]}-a{h[5:8]}-{h[8:16]}{h[:4]}"
            p = projects[i]
            project = self.projects[p]
            users = self.users[p]
            user = users[int(rand() * len(users))]
            vm_state, power_state, task_state, _ = states[i]
            f = flavors[i]
            fcols = self.flavor_cols[f]
            deleted = vm_state == "deleted"
            has_host = vm_state != "shelved_offloaded"
            host_i = hosts[i]
            host = self.hosts[host_i] if has_host else None
            r = rand()
            if r < 0.01:
                name = f"{UNICODE_NAMES[int(r * 600) % len(UNICODE_NAMES)]}-{bits & 0xFFF:03x}"
                hostname = f"server-{h[:8]}"
            else:
                name = f"{prefixes[i]}-{envs[i]}-{bits & 0x1FFF:04d}"
                hostname = name
            created_us = now_us - int(SPAN_US * rand() ** 2) - 600_000_000
            launched_us = created_us + 20_000_000 + int(rand() * 280_000_000)
            updated_us = launched_us + int((now_us - launched_us) * rand())
            # Any: datetimes, or their text on SQLite.
            created: Any = EPOCH + timedelta(microseconds=created_us)
            launched: Any = (
                None if vm_state == "building" else EPOCH + timedelta(microseconds=launched_us)
            )
            updated: Any = EPOCH + timedelta(microseconds=updated_us)
            gone: Any = updated if deleted else None
            if dates_as_text:
                created = created.isoformat(" ", "microseconds")
                updated = updated.isoformat(" ", "microseconds")
                launched = launched and launched.isoformat(" ", "microseconds")
                gone = gone and gone.isoformat(" ", "microseconds")
            b = bits >> 96
            ip = IP_PRIVATE % (
                b & 255,
                b >> 8 & 255,
                b >> 16 & 255,
                port,
                cell,
                b >> 8 & 255,
                b & 255,
                port[:11],
            )
            if r > 0.85:
                public = IP_PUBLIC % (b >> 16 & 255, b & 255, b >> 8 & 255, cell, b & 0xFFFF)
                ip = f"[{ip}, {public}]"
            else:
                ip = f"[{ip}]"
            keyed = r < 0.8
            locked = 0.5 < r < 0.52
            windows = 0.3 < r < 0.38
            self.seq += 1
            if has_host and not deleted:
                use = usage.get(host)  # type: ignore[arg-type]
                if use is None:
                    use = usage[host] = HostUsage()  # type: ignore[index]
                use.vcpus += fcols["vcpus"]
                use.memory_mb += fcols["memory_mb"]
                use.local_gb += fcols["root_gb"] + fcols["ephemeral_gb"]
            rows.append(
                (
                    uuid,
                    user,
                    project,
                    f"r-{h[24:32]}",
                    name,
                    None if r < 0.7 else f"{name} ({envs[i]})",
                    hostname,
                    host,
                    host and f"{host}.cloud.example",
                    "windows" if windows else "linux",
                    "aarch64" if 0.6 < r < 0.65 else "x86_64",
                    self.host_az[host_i],
                    self.flavor_json[f],
                    fcols["flavor_id"],
                    fcols["flavor_name"],
                    fcols["memory_mb"],
                    fcols["vcpus"],
                    fcols["root_gb"],
                    fcols["ephemeral_gb"],
                    images[i],
                    f"key-{user[:6]}" if keyed else None,
                    "",
                    "",
                    created,
                    updated,
                    launched,
                    gone,
                    gone,
                    vm_state,
                    power_state,
                    task_state,
                    0,
                    ip,
                    BDM % port if 0.2 < r < 0.5 else "[]",
                    metas[i],
                    "AUTO" if r > 0.9 else "MANUAL",
                    locked,
                    "maintenance" if locked else None,
                    f"req-{port}",
                    project,
                    user,
                    "[]",
                    tags[i],
                    self.keypairs[user] if keyed else "[]",
                    None,
                    f"instance-{self.seq:08x}",
                    False,
                    1 + int(rand() ** 3 * 6),
                    deleted,
                )
            )
        # In uuid order, the uuid indexes (cell and mappings) grow at few places at once.
        rows.sort()
        return rows

    def mappings(
        self, rows: list[tuple[Any, ...]], cell_uuid: str, dialect: str
    ) -> list[tuple[Any, ...]]:
        now: Any = self.now
        if dialect == "sqlite":
            now = self.now.isoformat(" ", "microseconds")
        deleted = COLUMNS.index("deleted")
        return [(row[0], cell_uuid, row[2], row[1], row[deleted], now, now) for row in rows]

    def compute_nodes(self, usage: dict[str, HostUsage]) -> list[dict[str, Any]]:
        """One node per host, sized so that what was placed on it fits."""
        now = self.now.replace(tzinfo=UTC)
        nodes = []
        for host, az in zip(self.hosts, self.host_az, strict=True):
            use = usage.get(host, HostUsage())
            vcpus = max(64, -(-use.vcpus // 4))
            memory = max(512 * 1024, use.memory_mb + 64 * 1024)
            disk = max(8000, use.local_gb + 500)
            nodes.append(
                {
                    "uuid": _uuid(self.rng),
                    "host": host,
                    "hypervisor_hostname": f"{host}.cloud.example",
                    "availability_zone": az,
                    "memory_mb": memory,
                    "memory_mb_used": use.memory_mb,
                    "vcpus": vcpus,
                    "vcpus_used": use.vcpus,
                    "local_gb": disk,
                    "local_gb_used": use.local_gb,
                    "cpu_allocation_ratio": 4.0,
                    "ram_allocation_ratio": 1.0,
                    "disk_allocation_ratio": 1.0,
                    "forthcoming_reservations": 0,
                    "disabled": False,
                    "offline": False,
                    "created_at": now,
                    "updated_at": now,
                    "revision": 1,
                    "deleted": False,
                }
            )
        return nodes
