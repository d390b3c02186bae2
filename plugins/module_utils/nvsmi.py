"""Parsers for nvidia-smi output (real driver output and the lab emulator's, which must match it).

Standard library only: imported by the Ansible modules on the hosts and by the pdctl CLI.
Every parser takes the text a command printed and returns plain dicts/lists.
"""
from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET

# `nvidia-smi topo -m` underlines its header with ANSI escapes (seen on real hosts).
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NA = ("N/A", "", "[N/A]", "[Not Supported]", "Not Supported", "Requested functionality has been deprecated")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def _num(value, cast=int):
    """'16x' -> 16, '143771 MiB' -> 143771, 'N/A' -> None."""
    if value is None:
        return None
    value = value.strip()
    if value in _NA:
        return None
    match = re.match(r"^-?[0-9]+(\.[0-9]+)?", value)
    if not match:
        return None
    return cast(match.group(0))


def _text(node, path, default=None):
    if node is None:
        return default
    found = node.find(path)
    if found is None or found.text is None:
        return default
    value = found.text.strip()
    return default if value in ("N/A", "") else value


def _sum_present(node, paths):
    """Sum the counters that exist and are numbers; None when none of them is readable."""
    total, seen = 0, False
    for path in paths:
        value = _num(_text(node, path))
        if value is not None:
            total += value
            seen = True
    return total if seen else None


# Volatile uncorrectable ECC counters differ between DTD versions: v13 (H200 capture) splits
# SRAM parity/SECDED and DRAM; older ones have sram_uncorrectable or double_bit/total.
_ECC_UNCORR = ("sram_uncorrectable_parity", "sram_uncorrectable_secded", "sram_uncorrectable",
               "dram_uncorrectable", "double_bit/total")
_ECC_CORR = ("sram_correctable", "dram_correctable", "single_bit/total")


def parse_query_xml(text: str) -> dict:
    """Parse `nvidia-smi -q -x`. GPU index is the position in the file (nvidia-smi's own order)."""
    root = ET.fromstring(text.split("?>", 1)[-1] if text.lstrip().startswith("<?xml") else text)
    result = {
        "driver_version": _text(root, "driver_version"),
        "cuda_version": _text(root, "cuda_version"),
        "attached_gpus": _num(_text(root, "attached_gpus")),
        "gpus": [],
    }
    for index, gpu in enumerate(root.findall("gpu")):
        pci = gpu.find("pci")
        link = pci.find("pci_gpu_link_info") if pci is not None else None
        volatile = gpu.find("ecc_errors/volatile")
        aggregate = gpu.find("ecc_errors/aggregate")
        result["gpus"].append({
            "index": index,
            "name": _text(gpu, "product_name"),
            "architecture": _text(gpu, "product_architecture"),
            "uuid": _text(gpu, "uuid"),
            "serial": _text(gpu, "serial"),
            "pci_bus_id": _text(pci, "pci_bus_id") or gpu.get("id"),
            "minor_number": _num(_text(gpu, "minor_number")),
            "module_id": _num(_text(gpu, "platformInfo/module_id")),
            "vbios_version": _text(gpu, "vbios_version"),
            "persistence_mode": _text(gpu, "persistence_mode"),
            "mig_mode": _text(gpu, "mig_mode/current_mig"),
            "memory_total_mib": _num(_text(gpu, "fb_memory_usage/total")),
            "ecc_mode": _text(gpu, "ecc_mode/current_ecc"),
            "ecc_mode_pending": _text(gpu, "ecc_mode/pending_ecc"),
            "ecc_volatile_uncorrected": _sum_present(volatile, _ECC_UNCORR),
            "ecc_volatile_corrected": _sum_present(volatile, _ECC_CORR),
            "ecc_aggregate_uncorrected": _sum_present(aggregate, _ECC_UNCORR),
            "retired_pages": {
                "single_bit": _num(_text(gpu, "retired_pages/multiple_single_bit_retirement/retired_count")),
                "double_bit": _num(_text(gpu, "retired_pages/double_bit_retirement/retired_count")),
                "pending": _text(gpu, "retired_pages/pending_retirement"),
            },
            "remapped_rows": {
                "correctable": _num(_text(gpu, "remapped_rows/remapped_row_corr")),
                "uncorrectable": _num(_text(gpu, "remapped_rows/remapped_row_unc")),
                "pending": _text(gpu, "remapped_rows/remapped_row_pending"),
                "failure": _text(gpu, "remapped_rows/remapped_row_failure"),
            },
            "pcie": {
                "gen_current": _num(_text(link, "pcie_gen/current_link_gen")),
                "gen_max": _num(_text(link, "pcie_gen/max_link_gen")),
                "width_current": _num(_text(link, "link_widths/current_link_width")),
                "width_max": _num(_text(link, "link_widths/max_link_width")),
            },
            "fabric": {
                "state": _text(gpu, "fabric/state", "N/A"),
                "status": _text(gpu, "fabric/status", "N/A"),
                "clique_id": _text(gpu, "fabric/cliqueId"),
                "cluster_uuid": _text(gpu, "fabric/clusterUuid"),
                "health": _text(gpu, "fabric/health/summary"),
            },
            "power_limit_w": _num(_text(gpu, "gpu_power_readings/current_power_limit"), float),
            "driver_version": result["driver_version"],
            "cuda_version": result["cuda_version"],
        })
    return result


_GPU_HEAD = re.compile(r"^GPU\s+(\d+):\s*(.*?)\s*(?:\(UUID:\s*(\S+?)\))?\s*$")
_LINK_LINE = re.compile(r"^\s*Link\s+(\d+):\s*(.*?)\s*$")


def _by_gpu(text: str):
    """Yield (gpu_index, name, uuid, [lines]) blocks of `nvidia-smi nvlink ...` output."""
    current = None
    for line in strip_ansi(text).splitlines():
        head = _GPU_HEAD.match(line)
        if head:
            if current:
                yield current
            current = (int(head.group(1)), head.group(2), head.group(3), [])
        elif current and line.strip():
            current[3].append(line)
    if current:
        yield current


def parse_nvlink_status(text: str) -> dict:
    """Parse `nvidia-smi nvlink --status`: {gpu: {name, uuid, links: {n: {state, speed_gbps}}}}.

    An active link prints its speed ('53.125 GB/s'), a down one '<inactive>'.
    """
    gpus = {}
    for index, name, uuid, lines in _by_gpu(text):
        links = {}
        for line in lines:
            match = _LINK_LINE.match(line)
            if not match:
                continue
            value = match.group(2)
            speed = re.match(r"^([0-9.]+)\s*GB/s", value)
            if speed:
                links[int(match.group(1))] = {"state": "Active", "speed_gbps": float(speed.group(1))}
            else:
                state = "Inactive" if "inactive" in value.lower() else value.strip("<>") or "Unknown"
                links[int(match.group(1))] = {"state": state, "speed_gbps": None}
        gpus[index] = {"name": name, "uuid": uuid, "links": links}
    return gpus


def parse_nvlink_errors(text: str) -> dict:
    """Parse `nvidia-smi nvlink -e`: {gpu: {link: {'replay_errors': n, 'recovery_errors': n, ...}}}."""
    gpus = {}
    for index, _name, _uuid, lines in _by_gpu(text):
        links = gpus.setdefault(index, {})
        for line in lines:
            match = re.match(r"^\s*Link\s+(\d+):\s*([^:]+?)\s*:\s*(\S+)", line)
            if not match:
                continue
            key = re.sub(r"[^a-z0-9]+", "_", match.group(2).lower()).strip("_")
            links.setdefault(int(match.group(1)), {})[key] = _num(match.group(3))
    return gpus


def parse_topo_matrix(text: str) -> dict:
    """Parse `nvidia-smi topo -m` into {devices, matrix, affinity, nic_names}.

    matrix[a][b] is the connection kind printed (X, NV18, PIX, PXB, PHB, NODE, SYS, ...).
    """
    lines = strip_ansi(text).splitlines()
    header_at = next((i for i, line in enumerate(lines) if line.startswith("\t") and "GPU0" in line), None)
    if header_at is None:
        return {"devices": [], "matrix": {}, "affinity": {}, "nic_names": {}}
    columns = [c.strip() for c in lines[header_at].split("\t") if c.strip()]
    devices = [c for c in columns if re.match(r"^(GPU|NIC)\d+$", c)]
    matrix, affinity = {}, {}
    for line in lines[header_at + 1:]:
        if not line.strip() or line.startswith("Legend"):
            break
        cells = [c.strip() for c in line.split("\t")]
        name, cells = cells[0], [c for c in cells[1:] if c != ""]
        if not re.match(r"^(GPU|NIC)\d+$", name):
            break
        row = dict(zip(columns, cells))
        matrix[name] = {d: row.get(d) for d in devices}
        if name.startswith("GPU"):
            affinity[name] = {
                "cpu": row.get("CPU Affinity"),
                "numa": row.get("NUMA Affinity"),
                "gpu_numa_id": row.get("GPU NUMA ID"),
            }
    nic_names = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", "\n".join(lines), re.M))
    return {"devices": devices, "matrix": matrix, "affinity": affinity, "nic_names": nic_names}


def link_kinds(topo: dict) -> dict:
    """Count GPU<->GPU connection kinds (each unordered pair once): {'NV18': 28}."""
    gpus = [d for d in topo["devices"] if d.startswith("GPU")]
    counts: dict = {}
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            kind = (topo["matrix"].get(a) or {}).get(b) or "unknown"
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def parse_query_csv(text: str, fields=None) -> list:
    """Parse `--query-gpu=... --format=csv[,noheader][,nounits]`.

    Keys are the query field names (units such as ' [MiB]' dropped from headers). With noheader,
    pass the field list that was queried.
    """
    rows = [r for r in csv.reader(io.StringIO(text.strip()), skipinitialspace=True) if r]
    if fields is None:
        if not rows:
            return []
        fields = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in rows[0]]
        rows = rows[1:]
    return [dict(zip(fields, (c.strip() for c in row))) for row in rows]


def parse_version(text: str) -> dict:
    """Parse `nvidia-smi --version` ('DRIVER version : 580.159.04') into snake_case keys."""
    found = {}
    for key, value in re.findall(r"^\s*([A-Za-z -]+?)\s*:\s*(\S+)\s*$", text, re.M):
        found[re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_")] = value
    return found
