"""Judge a host's GPUs/NVLinks against an expected hardware profile (nvlink_check's logic).

Input is what nvsmi parsed; output is a report (what was found, whatever the machine) and a
list of failure messages that each name the host, the GPU/link/peer, and expected vs found.
Standard library only.
"""
from __future__ import annotations

from ansible_collections.pdctl.vllm_pd.plugins.module_utils.hwprofile import nic_entries
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.nvsmi import link_kinds

# NVLink error counters above these fail the check (per link, since the last counter reset).
DEFAULT_THRESHOLDS = {"replay_errors": 100, "recovery_errors": 0, "crc_errors": 100,
                      "ecc_volatile_uncorrected": 0}

QUERY_FIELDS = ["index", "uuid", "name", "pci.bus_id", "driver_version", "fabric.state", "fabric.status",
                "ecc.mode.current", "ecc.errors.uncorrected.volatile.total"]


def _int(value):
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def check_state(host, profile, query_rows, nvlink_status, nvlink_errors, topo, version=None,
                thresholds=None, fabric_manager_version=None):
    """Return (report, failures) for `mode: state`."""
    limits = dict(DEFAULT_THRESHOLDS, **(thresholds or {}))
    expected_gpus = profile["gpu"]["count"]
    nvl = profile.get("nvlink") or {}
    expected_links = nvl.get("links_per_gpu", 0)
    expected_speed = nvl.get("link_speed_gbps")
    peer_kind = nvl.get("peer_connection") or (f"NV{expected_links}" if expected_links else None)
    fabric = profile.get("fabric") or {}
    failures = []

    driver = (version or {}).get("driver_version") or next(
        (r.get("driver_version") for r in query_rows if r.get("driver_version")), None)
    gpus = [d for d in topo.get("devices", []) if d.startswith("GPU")]
    report = {
        "gpu_count": len(query_rows),
        "driver_version": driver,
        "topology": topo.get("matrix", {}),
        "nic_names": topo.get("nic_names", {}),
        "link_kinds": link_kinds(topo),
        "links_per_gpu": {},
        "gpus": [],
    }

    # GPU count, naming the PCI addresses that went missing when the profile lists them.
    if len(query_rows) != expected_gpus:
        found_bus = {str(r.get("pci.bus_id", "")).upper() for r in query_rows}
        missing = [b for b in profile["gpu"].get("bus_ids", [])[:expected_gpus] if b.upper() not in found_bus]
        extra = f" (missing PCI {', '.join(missing)})" if missing and len(query_rows) < expected_gpus else ""
        failures.append(f"{host}: {len(query_rows)} GPUs found, expected {expected_gpus}{extra}")

    want_driver = profile.get("driver_version")
    if want_driver and driver != want_driver:
        failures.append(f"{host}: NVIDIA driver {driver}, expected {want_driver}")
    if fabric_manager_version and driver and fabric_manager_version != driver:
        failures.append(f"{host}: nvidia-fabricmanager {fabric_manager_version} does not match driver {driver}"
                        " (they must be the same version)")

    for row in query_rows:
        idx = _int(row.get("index"))
        state, status = row.get("fabric.state", "N/A"), row.get("fabric.status", "N/A")
        ecc = _int(row.get("ecc.errors.uncorrected.volatile.total"))
        report["gpus"].append({"index": idx, "uuid": row.get("uuid"), "pci_bus_id": row.get("pci.bus_id"),
                               "fabric_state": state, "fabric_status": status, "ecc_volatile_uncorrected": ecc})
        want_state, want_status = fabric.get("state"), fabric.get("status")
        if want_state and (state != want_state or (want_status and status != want_status)):
            failures.append(f"{host} GPU {idx}: fabric state {state}/status {status}, "
                            f"expected {want_state}/{want_status or 'any'}")
        if ecc is not None and ecc > limits["ecc_volatile_uncorrected"]:
            failures.append(f"{host} GPU {idx}: {ecc} volatile uncorrected ECC errors, "
                            f"expected at most {limits['ecc_volatile_uncorrected']}")
        want_ecc = profile["gpu"].get("ecc_mode")
        if want_ecc and row.get("ecc.mode.current") not in (None, want_ecc):
            failures.append(f"{host} GPU {idx}: ECC mode {row.get('ecc.mode.current')}, expected {want_ecc}")

    # Links: state and speed per link, then counters.
    for idx, info in sorted(nvlink_status.items()):
        links = info["links"]
        active = sum(1 for link in links.values() if link["state"] == "Active")
        report["links_per_gpu"][idx] = {"total": len(links), "active": active}
        if expected_links and len(links) < expected_links:
            failures.append(f"{host} GPU {idx}: {len(links)} NVLinks reported, expected {expected_links}")
        for n, link in sorted(links.items()):
            if n >= expected_links and expected_links:
                continue
            if link["state"] != "Active":
                failures.append(f"{host} GPU {idx} link {n}: state {link['state']}, expected Active")
            elif expected_speed and link["speed_gbps"] is not None and link["speed_gbps"] + 1e-6 < expected_speed:
                failures.append(f"{host} GPU {idx} link {n}: speed {link['speed_gbps']} GB/s, "
                                f"expected {expected_speed} GB/s")
    if expected_links:
        for row in query_rows:
            idx = _int(row.get("index"))
            if idx not in nvlink_status:
                failures.append(f"{host} GPU {idx}: no NVLinks reported, expected {expected_links}")
    for idx, links in sorted(nvlink_errors.items()):
        for n, counters in sorted(links.items()):
            for key, value in sorted(counters.items()):
                limit = limits.get(key)
                if limit is not None and value is not None and value > limit:
                    failures.append(f"{host} GPU {idx} link {n}: {value} {key.replace('_', ' ')}, "
                                    f"expected at most {limit}")

    # The NIC layout and CPU lists the plan placed each instance by (UCX_NET_DEVICES, CPUAffinity=).
    # GPU slots equal nvidia-smi indices only when no GPU is missing (that already failed above).
    if len(query_rows) == expected_gpus:
        failures += _check_placement(host, profile, topo)

    # Topology: every GPU pair should show the expected NVLink bond.
    if peer_kind:
        for i, a in enumerate(gpus):
            for b in gpus[i + 1:]:
                found = (topo["matrix"].get(a) or {}).get(b)
                if found != peer_kind:
                    failures.append(f"{host} {a} <-> {b}: {found}, expected {peer_kind}")
    return report, failures


def _check_placement(host, profile, topo):
    failures = []
    legend = {name: nic for nic, name in (topo.get("nic_names") or {}).items()}
    matrix = topo.get("matrix") or {}
    for nic in nic_entries(profile):
        name, what = nic["name"], nic.get("model") or nic.get("device") or "NIC"
        if name not in legend:
            failures.append(f"{host}: {what} {name} is not in the `nvidia-smi topo -m` NIC legend "
                            f"(found: {', '.join(sorted(legend)) or 'none'}); the plan's KV NICs assume it")
            continue
        if nic["role"] == "kv" and nic["gpu"] is not None:
            cell = (matrix.get(f"GPU{nic['gpu']}") or {}).get(legend[name])
            if cell not in ("PIX", "PXB"):
                failures.append(f"{host} GPU{nic['gpu']} <-> {name} ({legend[name]}): {cell}, expected PIX or PXB "
                                f"(the KV NIC the plan gives GPU {nic['gpu']}'s instance)")
    want_cpus = (profile.get("gpu") or {}).get("cpu_affinity") or []
    for slot, want in enumerate(want_cpus):
        found = ((topo.get("affinity") or {}).get(f"GPU{slot}") or {}).get("cpu")
        if found is not None and found != want:
            failures.append(f"{host} GPU{slot}: CPU affinity {found}, expected {want} (the plan pins its "
                            "instance there: set pdctl_hw_profile.gpu.cpu_affinity from the host)")
    return failures


def check_bandwidth(host, profile, result, floor_gbps):
    """Judge the P2P copy measurement (hwbench output). Returns (report, failures)."""
    failures = []
    expected = profile["gpu"]["count"]
    if result.get("device_count") != expected:
        failures.append(f"{host}: {result.get('device_count')} GPUs visible to torch, expected {expected}")
    for pair in result.get("pairs", []):
        if pair["gbps"] < floor_gbps:
            failures.append(f"{host} GPU {pair['src']} -> GPU {pair['dst']}: {pair['gbps']:.1f} GB/s, "
                            f"expected at least {floor_gbps} GB/s (peer access {pair.get('peer_access')})")
    return result, failures
