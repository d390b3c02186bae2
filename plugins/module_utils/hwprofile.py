"""The per-host hardware profile: what a host should look like (nvlink_check) and what the lab
GPU emulator pretends to be. One format for both; docs/hardware-profile.md describes it.

The profile is JSON (which is also YAML), so the stdlib-only emulator can read it on a test host.
Standard library only.
"""
from __future__ import annotations

import json
from collections.abc import Mapping

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
    # One ConnectX-8 SuperNIC (MT4131) on each GPU's PCIe switch carries KV; four ConnectX-7 (MT4129) are
    # the NVSwitch management ports (Fabric Manager / NVLSM), never a KV path. Names as on a public Dell
    # XE9780 capture; numbering differs between vendors: confirm per site from `nvidia-smi topo -m`.
    "nics": [
        {"name": "mlx5_0", "device": "MT4131", "model": "ConnectX-8", "numa": 0, "gpu": 0, "role": "kv"},
        {"name": "mlx5_1", "device": "MT4131", "model": "ConnectX-8", "numa": 0, "gpu": 1, "role": "kv"},
        {"name": "mlx5_2", "device": "MT4129", "model": "ConnectX-7", "numa": 0, "gpu": None, "role": "switch_mgmt"},
        {"name": "mlx5_3", "device": "MT4129", "model": "ConnectX-7", "numa": 0, "gpu": None, "role": "switch_mgmt"},
        {"name": "mlx5_4", "device": "MT4129", "model": "ConnectX-7", "numa": 1, "gpu": None, "role": "switch_mgmt"},
        {"name": "mlx5_5", "device": "MT4129", "model": "ConnectX-7", "numa": 1, "gpu": None, "role": "switch_mgmt"},
        {"name": "mlx5_6", "device": "MT4131", "model": "ConnectX-8", "numa": 0, "gpu": 2, "role": "kv"},
        {"name": "mlx5_7", "device": "MT4131", "model": "ConnectX-8", "numa": 0, "gpu": 3, "role": "kv"},
        {"name": "mlx5_8", "device": "MT4131", "model": "ConnectX-8", "numa": 1, "gpu": 4, "role": "kv"},
        {"name": "mlx5_9", "device": "MT4131", "model": "ConnectX-8", "numa": 1, "gpu": 5, "role": "kv"},
        {"name": "mlx5_10", "device": "MT4131", "model": "ConnectX-8", "numa": 1, "gpu": 6, "role": "kv"},
        {"name": "mlx5_11", "device": "MT4131", "model": "ConnectX-8", "numa": 1, "gpu": 7, "role": "kv"},
    ],
    "faults": {},
}

# Fault keys the emulator understands (nvlink_check ignores the faults section).
FAULT_KEYS = ("missing_gpus", "links_down", "link_speed", "nvlink_errors", "fabric", "ecc_errors",
              "driver_version", "fabric_manager_version")


NIC_ROLES = ("kv", "switch_mgmt")


class ProfileError(ValueError):
    pass


def nic_entries(profile: dict) -> list:
    """The profile's NICs as dicts {name, device, model, numa, gpu, role}; a bare name is a KV NIC."""
    out = []
    for nic in profile.get("nics") or []:
        entry = {"name": nic} if isinstance(nic, str) else dict(nic)
        if not entry.get("name"):
            raise ProfileError(f"hardware profile NIC without a name: {nic!r}")
        entry.setdefault("role", "kv")
        entry.setdefault("gpu", None)
        out.append(entry)
    return out


def kv_nics(profile: dict) -> list:
    """Names of the NICs that may carry KV (never an NVSwitch management port)."""
    return [n["name"] for n in nic_entries(profile) if n["role"] == "kv"]


def placement(profile: dict, slots) -> dict:
    """Where an instance on GPU slots `slots` belongs: {nics, numa_nodes, cpu_affinity}.

    nics: for each GPU, the KV NIC on its PCIe switch (`gpu` in the profile, PIX/PXB in `topo -m`), else
    the KV NICs on its NUMA node; never a switch management port. [] when the profile lists no NICs.
    cpu_affinity: the GPUs' CPU lists (topo -m "CPU Affinity"), in slot order, duplicates dropped.
    """
    gpu = profile.get("gpu") or {}
    numa = gpu.get("numa_nodes") or []
    cpus = gpu.get("cpu_affinity") or []
    listed = nic_entries(profile)
    entries = [n for n in listed if n["role"] == "kv"]
    names, nodes, cpu_lists = [], [], []
    for slot in slots:
        node = numa[slot] if slot < len(numa) else None
        if node is not None and node not in nodes:
            nodes.append(node)
        if slot < len(cpus) and cpus[slot] not in cpu_lists:
            cpu_lists.append(cpus[slot])
        if not listed:
            continue
        near = [n["name"] for n in entries if n["gpu"] == slot] or \
               [n["name"] for n in entries if n.get("numa") is not None and n.get("numa") == node]
        if not near:
            raise ProfileError(f"GPU {slot} (NUMA node {node}) has no KV NIC in the hardware profile "
                               f"(KV NICs: {', '.join(n['name'] for n in entries) or 'none'})")
        names.extend(n for n in near if n not in names)
    return {"nics": names, "numa_nodes": nodes, "cpu_affinity": " ".join(cpu_lists)}


def _copy(value):
    """A plain copy of nested dicts, lists and tuples. Not copy.deepcopy: the input may be Ansible's
    lazily templated containers, whose deep copy carries their templating context (about 0.1 s for
    one profile, 1.6 s for the plan of the three lab hosts)."""
    if isinstance(value, Mapping):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_copy(item) for item in value)
    return value


def merge(base: dict, override: dict) -> dict:
    """Deep-merge override into a copy of base (dicts merge, everything else replaces)."""
    out = _copy(base)
    _merge_into(out, override)
    return out


def _merge_into(out: dict, override: dict) -> None:
    """Merge override into out in place (out is already a copy: nested dicts are not copied again)."""
    for key, value in (override or {}).items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            _merge_into(out[key], value)
        else:
            out[key] = _copy(value)


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
    for nic in nic_entries(profile):
        if nic.get("role", "kv") not in NIC_ROLES:
            raise ProfileError(f"hardware profile NIC {nic.get('name')!r} role {nic.get('role')!r}, expected one of {list(NIC_ROLES)}")
        gpu_slot = nic.get("gpu")
        if gpu_slot is not None and (isinstance(gpu_slot, bool) or not isinstance(gpu_slot, int) or gpu_slot < 0):
            raise ProfileError(f"hardware profile NIC {nic.get('name')!r} gpu {gpu_slot!r}, expected a GPU slot or null")
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
