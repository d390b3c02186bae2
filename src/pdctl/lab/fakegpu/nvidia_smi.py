#!/usr/bin/python3
"""Lab stand-in for `nvidia-smi` on hosts without GPUs: prints what an HGX B300 would, in the
real output formats, from a hardware profile (docs/hardware-profile.md), with injected faults.

Standard library only: it is installed as /usr/bin/nvidia-smi on Debian 12 test hosts.
Profile: $PDCTL_HW_PROFILE, else /etc/pdctl/hw-profile.json (or .yml), else the built-in B300.
Deterministic output for fixtures: PDCTL_FAKEGPU_SEED (UUIDs) and PDCTL_FAKEGPU_TIME (timestamp).
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import socket
import sys
import time

PROFILE_PATHS = ("/etc/pdctl/hw-profile.json", "/etc/pdctl/hw-profile.yml")
# Written by the lab's nvidia-persistenced stand-in: "Enabled" / "Disabled", as the daemon's flags and
# state leave the GPUs. Absent (no daemon installed yet, or a test machine): the profile decides.
PERSISTENCE_STATE = "/run/nvidia-persistenced/pdctl-lab-persistence-mode"
# The driver's user space and kernel module, as on a real host. The nvidia-smi stand-in package bakes its
# own version in (LIBRARY_VERSION, its NVML); the kernel module stand-in (package nvidia-kernel-open-dkms)
# writes the version it "loaded" at boot here, on tmpfs, as /sys/module/nvidia/version is: a driver
# upgrade shows only after a reboot (or a module reload), and until then the two disagree. None (a
# checkout, tests): the profile's driver_version is the driver.
LIBRARY_VERSION = None
MODULE_VERSION_FILE = "/run/pdctl-lab/sys/module/nvidia/version"

# Same content as module_utils/hwprofile.py B300_DEFAULT and profiles/b300.json (tested).
DEFAULT_PROFILE = {
    "schema": 1,
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
    "nvlink": {"version": 5, "links_per_gpu": 18, "link_speed_gbps": 53.125, "peer_connection": "NV18"},
    "fabric": {"state": "Completed", "status": "Success", "clique_id": "32766"},
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


def _merge(base, override):
    out = copy.deepcopy(base)
    for key, value in (override or {}).items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_profile(path=None):
    candidates = [path or os.environ.get("PDCTL_HW_PROFILE")] if (path or os.environ.get("PDCTL_HW_PROFILE")) \
        else list(PROFILE_PATHS)
    for candidate in candidates:
        if candidate and os.path.exists(candidate):
            with open(candidate, encoding="utf-8") as handle:
                text = handle.read()
            try:
                data = json.loads(text)
            except ValueError:
                import yaml  # only when the file is real YAML and PyYAML is there
                data = yaml.safe_load(text)
            return _merge(DEFAULT_PROFILE, data)
    if path or os.environ.get("PDCTL_HW_PROFILE"):
        raise SystemExit(f"nvidia-smi (pdctl-lab emulator): profile {candidates[0]} not found")
    return copy.deepcopy(DEFAULT_PROFILE)


class Machine:
    """The GPUs the profile describes, with its faults applied.

    Faults name GPUs by slot (position in the full profile); nvidia-smi renumbers what is left,
    so with slot 5 missing, slot 6 prints as GPU 5 - as a real host with a lost GPU does.
    """

    def __init__(self, profile, driver=None):
        self.p = profile
        driver = driver or profile["driver_version"]
        # Faults of one driver release (a host that comes back from a driver upgrade with a link down)
        # add to the ones it always has.
        faults = _merge(profile.get("faults") or {}, (profile.get("faults_by_driver") or {}).get(driver) or {})
        gpu = profile["gpu"]
        self.driver = faults.get("driver_version", driver)
        self.persistence = _persistence_state() or gpu.get("persistence_mode", "Enabled")
        self.cuda = profile["cuda_version"]
        missing = set(faults.get("missing_gpus") or [])
        seed = os.environ.get("PDCTL_FAKEGPU_SEED") or socket.gethostname()
        nlinks = profile["nvlink"]["links_per_gpu"]
        self.gpus = []
        for slot in range(gpu["count"]):
            if slot in missing:
                continue
            digest = hashlib.sha256(f"{seed}/{slot}".encode()).hexdigest()
            links = {n: profile["nvlink"]["link_speed_gbps"] for n in range(nlinks)}
            for down in faults.get("links_down") or []:
                if down["gpu"] == slot:
                    links[down["link"]] = None
            for slow in faults.get("link_speed") or []:
                if slow["gpu"] == slot:
                    links[slow["link"]] = slow["speed_gbps"]
            fabric = dict(profile["fabric"])
            for bad in faults.get("fabric") or []:
                if bad.get("gpu") in (slot, "all"):
                    fabric.update({k: v for k, v in bad.items() if k != "gpu"})
            ecc = {"volatile_uncorrected": 0, "volatile_corrected": 0}
            for err in faults.get("ecc_errors") or []:
                if err["gpu"] == slot:
                    ecc.update({k: v for k, v in err.items() if k != "gpu"})
            nvl_errors = {}
            for err in faults.get("nvlink_errors") or []:
                if err["gpu"] == slot:
                    nvl_errors[err["link"]] = err
            self.gpus.append({
                "index": len(self.gpus),
                "slot": slot,
                "name": gpu["name"],
                "uuid": "GPU-%s-%s-%s-%s-%s" % (digest[:8], digest[8:12], digest[12:16], digest[16:20], digest[20:32]),
                "serial": str(int(digest[:10], 16))[:13],
                "bus_id": gpu["bus_ids"][slot] if slot < len(gpu.get("bus_ids", [])) else "00000000:%02X:00.0" % (0x10 + slot),
                "numa": gpu.get("numa_nodes", [0] * (slot + 1))[slot] if slot < len(gpu.get("numa_nodes", [])) else 0,
                "cpus": gpu.get("cpu_affinity", [])[slot] if slot < len(gpu.get("cpu_affinity", [])) else "0-1",
                "links": links,
                "nvl_errors": nvl_errors,
                "fabric": fabric,
                "ecc": ecc,
            })

    def nvlinks_active(self, gpu):
        return sum(1 for speed in gpu["links"].values() if speed)

    def connection(self, a, b):
        """NV<n> through the NVSwitches: bounded by the GPU with fewer active links."""
        if a is b:
            return "X"
        n = min(self.nvlinks_active(a), self.nvlinks_active(b))
        if n:
            return f"NV{n}"
        return "NODE" if a["numa"] == b["numa"] else "SYS"


def _persistence_state():
    path = os.environ.get("PDCTL_FAKEGPU_PERSISTENCE_STATE", PERSISTENCE_STATE)
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def timestamp():
    fixed = os.environ.get("PDCTL_FAKEGPU_TIME")
    return fixed or time.strftime("%a %b %d %H:%M:%S %Y")


def _ecc_total(gpu):
    return gpu["ecc"]["volatile_uncorrected"]


# ---------------------------------------------------------------- default table

def render_table(m: Machine) -> str:
    sep = "+-----------------------------------------+------------------------+----------------------+"
    out = [timestamp().ljust(31),
           "+" + "-" * 89 + "+",
           "| NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %-9s|" % (m.driver, m.driver, m.cuda),
           sep,
           "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
           "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
           "|                                         |                        |               MIG M. |",
           "|=========================================+========================+======================|"]
    gp = m.p["gpu"]
    for gpu in m.gpus:
        persist = "On" if m.persistence == "Enabled" else "Off"
        out.append("|%4d  %-28s%5s  |%19s %3s |%21s |" % (gpu["index"], gpu["name"][:28], persist,
                                                        gpu["bus_id"], "Off", _ecc_total(gpu)))
        out.append("|%4s%5sC%6s%15sW / %4dW |%8dMiB / %6dMiB |%7d%%%13s |" % (
            "N/A", 30, "P0", 140, gp["power_limit_w"], 0, gp["memory_mib"], 0, "Default"))
        out.append("|%41s|%24s|%21s |" % ("", "", "Disabled"))
        out.append(sep)
    if not m.gpus:
        return "No devices were found\n"
    out += ["", "+" + "-" * 89 + "+",
            "| Processes:%78s|" % "",
            "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
            "|        ID   ID                                                               Usage      |",
            "|" + "=" * 89 + "|",
            "|  No running processes found%61s|" % "",
            "+" + "-" * 89 + "+"]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- -q -x

def _x(tag, value, depth):
    return "\t" * depth + f"<{tag}>{value}</{tag}>"


def render_xml(m: Machine) -> str:
    gp = m.p["gpu"]
    out = ['<?xml version="1.0" ?>', '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">', "<nvidia_smi_log>",
           _x("timestamp", timestamp(), 1), _x("driver_version", m.driver, 1), _x("cuda_version", m.cuda, 1),
           _x("attached_gpus", len(m.gpus), 1)]
    for gpu in m.gpus:
        bus = gpu["bus_id"]
        domain, rest = bus.split(":", 1)
        pbus, dev = rest.split(":")[0], rest.split(":")[1].split(".")[0]
        fab = gpu["fabric"]
        g = [f'\t<gpu id="{bus}">']
        add = g.append
        add(_x("product_name", gpu["name"], 2))
        add(_x("product_brand", "NVIDIA", 2))
        add(_x("product_architecture", gp["architecture"], 2))
        add(_x("persistence_mode", m.persistence, 2))
        add("\t\t<mig_mode>\n" + _x("current_mig", "Disabled", 3) + "\n" + _x("pending_mig", "Disabled", 3) + "\n\t\t</mig_mode>")
        add(_x("serial", gpu["serial"], 2))
        add(_x("uuid", gpu["uuid"], 2))
        add(_x("minor_number", gpu["index"], 2))
        add(_x("vbios_version", "97.00.00.00.01", 2))
        add("\t\t<platformInfo>\n" + _x("module_id", gpu["slot"] + 1, 3) + "\n\t\t</platformInfo>")
        add("\t\t<pci>")
        for tag, val in (("pci_bus", pbus), ("pci_device", dev), ("pci_domain", domain[-4:]),
                         ("pci_device_id", "31C210DE"), ("pci_bus_id", bus)):
            add(_x(tag, val, 3))
        add("\t\t\t<pci_gpu_link_info>\n\t\t\t\t<pcie_gen>")
        for tag in ("max_link_gen", "current_link_gen", "device_current_link_gen", "max_device_link_gen"):
            add(_x(tag, gp["pcie_gen"], 5))
        add(_x("max_host_link_gen", gp["pcie_gen"], 5))
        add("\t\t\t\t</pcie_gen>\n\t\t\t\t<link_widths>")
        add(_x("max_link_width", f"{gp['pcie_width']}x", 5))
        add(_x("current_link_width", f"{gp['pcie_width']}x", 5))
        add("\t\t\t\t</link_widths>\n\t\t\t</pci_gpu_link_info>")
        add(_x("replay_counter", 0, 3))
        add("\t\t</pci>")
        add(_x("performance_state", "P0", 2))
        add("\t\t<fb_memory_usage>\n" + _x("total", f"{gp['memory_mib']} MiB", 3) + "\n" + _x("reserved", "0 MiB", 3)
            + "\n" + _x("used", "0 MiB", 3) + "\n" + _x("free", f"{gp['memory_mib']} MiB", 3) + "\n\t\t</fb_memory_usage>")
        add(_x("compute_mode", "Default", 2))
        add("\t\t<ecc_mode>\n" + _x("current_ecc", gp.get("ecc_mode", "Enabled"), 3) + "\n"
            + _x("pending_ecc", gp.get("ecc_mode", "Enabled"), 3) + "\n\t\t</ecc_mode>")
        unc, corr = gpu["ecc"]["volatile_uncorrected"], gpu["ecc"]["volatile_corrected"]
        add("\t\t<ecc_errors>")
        for scope in ("volatile", "aggregate"):
            add(f"\t\t\t<{scope}>")
            for tag, val in (("sram_correctable", 0), ("sram_uncorrectable_parity", 0), ("sram_uncorrectable_secded", 0),
                             ("dram_correctable", corr), ("dram_uncorrectable", unc)):
                add(_x(tag, val, 4))
            add(f"\t\t\t</{scope}>")
        add("\t\t</ecc_errors>")
        add("\t\t<retired_pages>\n\t\t\t<multiple_single_bit_retirement>\n" + _x("retired_count", "N/A", 4)
            + "\n\t\t\t</multiple_single_bit_retirement>\n\t\t\t<double_bit_retirement>\n" + _x("retired_count", "N/A", 4)
            + "\n\t\t\t</double_bit_retirement>\n" + _x("pending_retirement", "N/A", 3) + "\n\t\t</retired_pages>")
        add("\t\t<remapped_rows>")
        for tag, val in (("remapped_row_corr", 0), ("remapped_row_corr_inactive", 0), ("remapped_row_unc", 1 if unc else 0),
                         ("remapped_row_unc_inactive", 0), ("remapped_row_pending", "No"), ("remapped_row_failure", "No")):
            add(_x(tag, val, 3))
        add("\t\t</remapped_rows>")
        add("\t\t<gpu_power_readings>\n" + _x("power_state", "P0", 3) + "\n"
            + _x("current_power_limit", "%.2f W" % gp["power_limit_w"], 3) + "\n\t\t</gpu_power_readings>")
        add("\t\t<fabric>")
        add(_x("state", fab.get("state", "N/A"), 3))
        add(_x("status", fab.get("status", "N/A"), 3))
        add(_x("cliqueId", fab.get("clique_id", "N/A"), 3))
        add(_x("clusterUuid", fab.get("cluster_uuid", "00000000-0000-0000-0000-000000000000"), 3))
        add("\t\t\t<health>\n" + _x("summary", "Healthy" if fab.get("state") == "Completed" else "N/A", 4)
            + "\n\t\t\t</health>")
        add("\t\t</fabric>")
        add("\t\t<processes>\n\t\t</processes>")
        add("\t</gpu>")
        out += g
    out += ["", "</nvidia_smi_log>"]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- -q

def _q(label, value, depth):
    return ("    " * depth + label).ljust(55) + ": " + str(value)


def render_query_text(m: Machine) -> str:
    gp = m.p["gpu"]
    out = ["", "==============NVSMI LOG==============", "", _q("Timestamp", timestamp(), 0),
           _q("Driver Version", m.driver, 0), _q("CUDA Version", m.cuda, 0), "", _q("Attached GPUs", len(m.gpus), 0)]
    for gpu in m.gpus:
        fab = gpu["fabric"]
        out += [f"GPU {gpu['bus_id']}",
                _q("Product Name", gpu["name"], 1), _q("Product Brand", "NVIDIA", 1),
                _q("Product Architecture", gp["architecture"], 1),
                _q("Persistence Mode", m.persistence, 1),
                _q("Serial Number", gpu["serial"], 1), _q("GPU UUID", gpu["uuid"], 1),
                _q("Minor Number", gpu["index"], 1),
                "    PCI", _q("Bus Id", gpu["bus_id"], 2), "        GPU Link Info", "            PCIe Generation",
                _q("Max", gp["pcie_gen"], 4), _q("Current", gp["pcie_gen"], 4),
                "            Link Width", _q("Max", f"{gp['pcie_width']}x", 4), _q("Current", f"{gp['pcie_width']}x", 4),
                "    FB Memory Usage", _q("Total", f"{gp['memory_mib']} MiB", 2), _q("Used", "0 MiB", 2),
                "    ECC Mode", _q("Current", gp.get("ecc_mode", "Enabled"), 2), _q("Pending", gp.get("ecc_mode", "Enabled"), 2),
                "    ECC Errors", "        Volatile",
                _q("DRAM Correctable", gpu["ecc"]["volatile_corrected"], 3),
                _q("DRAM Uncorrectable", gpu["ecc"]["volatile_uncorrected"], 3),
                "    Fabric", _q("State", fab.get("state", "N/A"), 2), _q("Status", fab.get("status", "N/A"), 2),
                _q("CliqueId", fab.get("clique_id", "N/A"), 2), ""]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- nvlink

def render_nvlink_status(m: Machine, only=None) -> str:
    out = []
    for gpu in m.gpus:
        if only is not None and gpu["index"] != only:
            continue
        out.append(f"GPU {gpu['index']}: {gpu['name']} (UUID: {gpu['uuid']})")
        for link, speed in sorted(gpu["links"].items()):
            out.append(f"\t Link {link}: " + (("%.3f GB/s" % speed) if speed else "<inactive>"))
    return "\n".join(out) + ("\n" if out else "")


def render_nvlink_errors(m: Machine, only=None) -> str:
    out = []
    for gpu in m.gpus:
        if only is not None and gpu["index"] != only:
            continue
        out.append(f"GPU {gpu['index']}: {gpu['name']} (UUID: {gpu['uuid']})")
        for link in sorted(gpu["links"]):
            err = gpu["nvl_errors"].get(link, {})
            for key, label in (("replay", "Replay Errors"), ("recovery", "Recovery Errors"), ("crc", "CRC Errors")):
                out.append(f"\t Link {link}: {label}: {err.get(key, 0)}")
    return "\n".join(out) + ("\n" if out else "")


# ---------------------------------------------------------------- topo -m

LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def _nics(profile):
    """Profile NICs as dicts (a bare name is a NIC on no particular GPU's switch)."""
    out = []
    for i, nic in enumerate(profile.get("nics") or []):
        entry = {"name": nic} if isinstance(nic, str) else dict(nic)
        entry.setdefault("gpu", None)
        entry.setdefault("numa", None)
        out.append(entry)
    return out


def _gpu_nic(gpu, nic):
    """PIX: the NIC is on the GPU's PCIe switch; NODE: same socket; SYS: across sockets."""
    if nic["gpu"] is not None and nic["gpu"] == gpu["slot"]:
        return "PIX"
    return "NODE" if nic["numa"] is None or nic["numa"] == gpu["numa"] else "SYS"


def _nic_nic(a, b):
    if a is b:
        return "X"
    if a["numa"] is None or b["numa"] is None or a["numa"] == b["numa"]:
        return "NODE"
    return "SYS"


def render_topo(m: Machine) -> str:
    nics = _nics(m.p)
    names = [f"GPU{g['index']}" for g in m.gpus] + [f"NIC{i}" for i in range(len(nics))]
    head = "\t\x1b[4m" + "\t".join(names + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + "\x1b[0m"
    out = [head]
    for a in m.gpus:
        cells = [m.connection(a, b) for b in m.gpus] + [_gpu_nic(a, nic) for nic in nics]
        out.append(f"GPU{a['index']}\t" + "\t".join(" X " if c == "X" else c for c in cells)
                   + f"\t{a['cpus']}\t{a['numa']}\t\tN/A")
    for nic in nics:
        cells = [_gpu_nic(b, nic) for b in m.gpus] + [_nic_nic(nic, other) for other in nics]
        out.append(f"NIC{nics.index(nic)}\t" + "\t".join(" X " if c == "X" else c for c in cells))
    text = "\n".join(out) + "\n" + LEGEND
    if nics:
        text += "\nNIC Legend:\n\n" + "".join(f"  NIC{i}: {nic['name']}\n" for i, nic in enumerate(nics))
    return text


# ---------------------------------------------------------------- --query-gpu

_UNITS = {"memory.total": "MiB", "memory.used": "MiB", "memory.free": "MiB", "power.limit": "W",
          "power.draw": "W", "pcie.link.gen.current": None, "temperature.gpu": None}


def _field(m: Machine, gpu, field):
    gp = m.p["gpu"]
    return {
        "index": gpu["index"], "name": gpu["name"], "uuid": gpu["uuid"], "serial": gpu["serial"],
        "pci.bus_id": gpu["bus_id"], "driver_version": m.driver, "vbios_version": "97.00.00.00.01",
        "count": len(m.gpus), "memory.total": gp["memory_mib"], "memory.used": 0, "memory.free": gp["memory_mib"],
        "ecc.mode.current": gp.get("ecc_mode", "Enabled"), "ecc.mode.pending": gp.get("ecc_mode", "Enabled"),
        "ecc.errors.uncorrected.volatile.total": gpu["ecc"]["volatile_uncorrected"],
        "ecc.errors.corrected.volatile.total": gpu["ecc"]["volatile_corrected"],
        "persistence_mode": m.persistence,
        "fabric.state": gpu["fabric"].get("state", "N/A"), "fabric.status": gpu["fabric"].get("status", "N/A"),
        "pcie.link.gen.current": gp["pcie_gen"], "pcie.link.gen.max": gp["pcie_gen"],
        "pcie.link.width.current": gp["pcie_width"], "pcie.link.width.max": gp["pcie_width"],
        "temperature.gpu": 30, "power.limit": "%.2f" % gp["power_limit_w"], "power.draw": "140.00",
        "compute_cap": "10.3", "mig.mode.current": "Disabled",
    }.get(field, KeyError)


def render_query(m: Machine, fields, fmt):
    opts = set(fmt.split(",")) if fmt else set()
    if "csv" not in opts:
        return 2, "Only CSV output format is supported by the pdctl-lab emulator.\n"
    rows = []
    for gpu in m.gpus:
        row = []
        for field in fields:
            value = _field(m, gpu, field)
            if value is KeyError:
                return 2, f'Field "{field}" is not a valid field to query.\n\n'
            unit = _UNITS.get(field)
            row.append(f"{value} {unit}" if unit and "nounits" not in opts else str(value))
        rows.append(", ".join(row))
    if "noheader" not in opts:
        header = [f"{f} [{_UNITS[f]}]" if _UNITS.get(f) else f for f in fields]
        rows.insert(0, ", ".join(header))
    return 0, "\n".join(rows) + "\n"


def render_version(m: Machine) -> str:
    return (f"NVIDIA-SMI version  : {m.driver}\nNVML version        : {m.driver.rsplit('.', 1)[0]}\n"
            f"DRIVER version      : {m.driver}\nCUDA Version        : {m.cuda}\n")


def render_list(m: Machine) -> str:
    return "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in m.gpus)


# ---------------------------------------------------------------- command line

def loaded_driver(library=None, module_file=None):
    """(rc, message) when the driver cannot answer, else (0, the loaded module's version or None)."""
    library = library if library is not None else LIBRARY_VERSION
    if library is None:
        return 0, None
    try:
        with open(module_file or MODULE_VERSION_FILE, encoding="utf-8") as handle:
            module = handle.read().strip()
    except FileNotFoundError:
        return 9, ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
                   "the latest NVIDIA driver is installed and running.\n\n")
    if module != library:
        return 18, "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: %s\n" % library
    return 0, module


def run(argv, profile=None, library=None, module_file=None):
    """Return (rc, stdout) for an nvidia-smi command line; tests call this in-process."""
    rc, driver = loaded_driver(library, module_file)
    if rc:
        return rc, driver
    m = Machine(profile if profile is not None else load_profile(), driver)
    args = list(argv)
    query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
    fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), None)
    only = None
    for flag in ("-i", "--id"):
        if flag in args:
            only = int(args[args.index(flag) + 1])
    if not m.gpus and args[:1] != ["--version"]:
        return 6, "No devices were found\n"
    if query:
        return render_query(m, [f.strip() for f in query.split(",") if f.strip()], fmt)
    if args[:1] == ["--version"]:
        return 0, render_version(m)
    if args[:1] in (["-L"], ["--list-gpus"]):
        return 0, render_list(m)
    if args[:1] == ["nvlink"]:
        if {"-e", "--errorcounters"} & set(args):
            return 0, render_nvlink_errors(m, only)
        if {"-s", "--status"} & set(args):
            return 0, render_nvlink_status(m, only)
        return 0, ""
    if args[:1] == ["topo"]:
        if {"-m", "--matrix"} & set(args):
            return 0, render_topo(m)
        return 2, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
    if "-q" in args or "--query" in args:
        return 0, render_xml(m) if ("-x" in args or "--xml-format" in args) else render_query_text(m)
    if not args:
        return 0, render_table(m)
    return 2, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"


def main(argv=None):
    rc, out = run(sys.argv[1:] if argv is None else argv)
    sys.stdout.write(out)
    return rc


if __name__ == "__main__":
    sys.exit(main())
