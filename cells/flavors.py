"""The flavor catalog the operations and the seeder use (Nova's classic m1 set and a few more)."""

from __future__ import annotations

from typing import Any

from cellsight.cells.errors import UnknownFlavor


def _flavor(
    flavorid: str,
    name: str,
    vcpus: int,
    memory_mb: int,
    root_gb: int,
    ephemeral_gb: int = 0,
    extra_specs: dict[str, str] | None = None,
) -> dict[str, Any]:
    # The plain field dict of a FlavorPayload 1.4, as the instances.flavor column holds it.
    return {
        "flavorid": flavorid,
        "name": name,
        "memory_mb": memory_mb,
        "vcpus": vcpus,
        "root_gb": root_gb,
        "ephemeral_gb": ephemeral_gb,
        "swap": 0,
        "rxtx_factor": 1.0,
        "vcpu_weight": 0,
        "disabled": False,
        "is_public": True,
        "extra_specs": extra_specs or {},
        "projects": None,
        "description": None,
    }


FLAVORS: dict[str, dict[str, Any]] = {
    f["name"]: f
    for f in (
        _flavor("1", "m1.tiny", 1, 512, 1),
        _flavor("2", "m1.small", 1, 2048, 20),
        _flavor("3", "m1.medium", 2, 4096, 40),
        _flavor("4", "m1.large", 4, 8192, 80),
        _flavor("5", "m1.xlarge", 8, 16384, 160),
        _flavor("c1", "c1.large", 8, 8192, 40, extra_specs={"hw:cpu_policy": "dedicated"}),
        _flavor("r1", "r1.large", 4, 32768, 80),
        _flavor("g1", "g1.xlarge", 16, 65536, 200, 100, {"resources:VGPU": "1"}),
    )
}


def get_flavor(name: str) -> dict[str, Any]:
    """A copy of a flavor by name or flavorid; ``UnknownFlavor`` lists the names otherwise."""
    flavor = FLAVORS.get(name) or next((f for f in FLAVORS.values() if f["flavorid"] == name), None)
    if flavor is None:
        raise UnknownFlavor(name, list(FLAVORS))
    return {**flavor, "extra_specs": dict(flavor["extra_specs"])}
