"""The per-host hardware profile: what a host should look like (nvlink_check) and what the lab
GPU emulator pretends to be. One format for both; docs/hardware-profile.md describes it.

The profile is JSON (which is also YAML), so the stdlib-only emulator can read it on a test host.
Standard library only.
"""
from __future__ import annotations

import copy
import json

SCHEMA = 1

# HGX B300: 8 GPUs on NVSwitch, 18 NVLink 5 links each, fabric configured by Fabric Manager + NVLSM.
# Keep equal to src/pdctl/lab/fakegpu/profiles/b300.json (a unit test compares them).
B300_DEFAULT = {
    "schema": SCHEMA,
    "name": "hgx-b300",
    "driver_version": "580.95.05",
    "cuda_version": "13.0",
    "fabric_manager_version": "580.95.05",
    "gpu": {
        "count": 8,
        "name": "NVIDIA B300 SXM6 AC",
        "architecture": "Blackwell",
        "memory_mib": 275040,
        "power_limit_w": 1100,
        "pcie_gen": 6,
        "pcie_width": 16,
        "persistence_mode": "Enabled",
        "ecc_mode": "Enabled",
        "bus_ids": [
            "00000000:17:00.0", "00000000:3D:00.0", "00000000:60:00.0", "00000000:70:00.0",
            "00000000:9B:00.0", "00000000:BB:00.0", "00000000:DB:00.0", "00000000:EB:00.0",
        ],
        "numa_nodes": [0, 0, 0, 0, 1, 1, 1, 1],
        "cpu_affinity": ["0-55,112-167"] * 4 + ["56-111,168-223"] * 4,
    },
    "nvlink": {
        "version": 5,
        "links_per_gpu": 18,
        "link_speed_gbps": 53.125,
        "peer_connection": "NV18",
    },
    "fabric": {"state": "Completed", "status": "Success", "clique_id": "32766"},
    "nics": [],
    "faults": {},
}

# Fault keys the emulator understands (nvlink_check ignores the faults section).
FAULT_KEYS = ("missing_gpus", "links_down", "link_speed", "nvlink_errors", "fabric", "ecc_errors",
              "driver_version", "fabric_manager_version")


class ProfileError(ValueError):
    pass


def merge(base: dict, override: dict) -> dict:
    """Deep-merge override into a copy of base (dicts merge, everything else replaces)."""
    out = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def validate(profile: dict) -> dict:
    """Check the fields every consumer relies on; return the profile unchanged."""
    if profile.get("schema") != SCHEMA:
        raise ProfileError(f"hardware profile schema {profile.get('schema')!r}, expected {SCHEMA}")
    gpu = profile.get("gpu") or {}
    count = gpu.get("count")
    if not isinstance(count, int) or count < 0:
        raise ProfileError(f"hardware profile gpu.count {count!r}, expected an integer >= 0")
    for key in ("bus_ids", "numa_nodes", "cpu_affinity"):
        if gpu.get(key) and len(gpu[key]) < count:
            raise ProfileError(f"hardware profile gpu.{key} has {len(gpu[key])} entries, expected {count}")
    links = (profile.get("nvlink") or {}).get("links_per_gpu", 0)
    if not isinstance(links, int) or links < 0:
        raise ProfileError(f"hardware profile nvlink.links_per_gpu {links!r}, expected an integer >= 0")
    unknown = set(profile.get("faults") or {}) - set(FAULT_KEYS)
    if unknown:
        raise ProfileError(f"hardware profile faults {sorted(unknown)} unknown, expected some of {list(FAULT_KEYS)}")
    return profile


def resolve(override: dict | None = None, base: dict | None = None) -> dict:
    """The B300 default (or base) with override merged in, validated."""
    return validate(merge(base or B300_DEFAULT, override or {}))


def load(path: str) -> dict:
    """Read a profile file (JSON; YAML when PyYAML is importable) and merge it over the default."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        data = json.loads(text)
    except ValueError:
        try:
            import yaml  # optional: only JSON is guaranteed on a bare host
        except ImportError as exc:
            raise ProfileError(f"{path}: not JSON, and PyYAML is not installed to read YAML") from exc
        data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping")
    return resolve(data)
