"""The parsers, nvlink_check, kv_path_check's judging and gpu_facts (NVML path included) on output captured
from real machines: 2 x H200 on NVLink (fixtures/hw/h200-x2), 1 x H200 and 1 x H100 (h200-x1, h100-x1), and
the real HGX B300 facts in shared/facts.md. Expected values come from the captures themselves or from the
module's result recorded on that machine, never from the lab's GPU emulator.
"""
from __future__ import annotations

import ctypes
import json
import re

import pytest
from test_hw_modules import ExitJson, load, raising_exits  # noqa: F401  (fixture re-used)
from test_hw_support import FIXTURES

import requires
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import hwcheck, hwprofile, kvpath, nvsmi as nv
from ansible.module_utils.testing import patch_module_args

X2 = FIXTURES / "h200-x2"
X1 = FIXTURES / "h200-x1"
H100 = FIXTURES / "h100-x1"


def x2_sections():
    """captures.txt of the 2 x H200 run: nvidia-smi, topo -m, nvlink --status, a grep of -q, versions."""
    text = (X2 / "captures.txt").read_text()
    lines = text.splitlines(keepends=True)
    topo_at = next(i for i, line in enumerate(lines) if line.startswith("\t") and "GPU0" in line)
    status_at = next(i for i, line in enumerate(lines) if line.startswith("GPU 0: "))
    status_end = next(i for i, line in enumerate(lines) if i > status_at and not re.match(r"^(GPU \d+:|\s+Link )", line))
    return {"topo": "".join(lines[topo_at:status_at]), "status": "".join(lines[status_at:status_end])}


def hash_sections(path):
    """'### title' sections of a capture file."""
    out, title = {}, None
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith("### "):
            title = line[4:].strip()
            out[title] = ""
        elif title:
            out[title] += line
    return {k: v.split("\nrc=", 1)[0] for k, v in out.items()}


def query_rows_from_xml(parsed):
    """The query-gpu rows nvlink_check reads, taken from the same machine's `nvidia-smi -q -x`."""
    return [{"index": str(g["index"]), "uuid": g["uuid"], "name": g["name"], "pci.bus_id": g["pci_bus_id"],
             "driver_version": g["driver_version"], "fabric.state": g["fabric"]["state"],
             "fabric.status": g["fabric"]["status"], "ecc.mode.current": g["ecc_mode"],
             "ecc.errors.uncorrected.volatile.total": str(g["ecc_volatile_uncorrected"])} for g in parsed["gpus"]]


# --- 2 x H200 on NVLink -------------------------------------------------------------------------------

def test_h200_x2_xml():
    parsed = nv.parse_query_xml((X2 / "q.xml").read_text())
    assert parsed["driver_version"] == "580.159.04" and parsed["cuda_version"] == "13.0"
    assert [(g["index"], g["uuid"], g["pci_bus_id"]) for g in parsed["gpus"]] == [
        (0, "GPU-427ea194-3da8-cb26-2199-f26fd4ae8c1a", "00000000:00:06.0"),
        (1, "GPU-2084a3a6-012e-83c0-a23f-9ece2f7efc77", "00000000:00:07.0")]
    for g in parsed["gpus"]:
        assert g["name"] == "NVIDIA H200" and g["memory_total_mib"] == 143771 and g["power_limit_w"] == 700.0
        assert g["fabric"]["state"] == "Completed" and g["fabric"]["status"] == "Success"  # as `-q` printed
        assert g["fabric"]["clique_id"] == "0" and g["ecc_volatile_uncorrected"] == 0


def test_h200_x2_nvlink_status_and_topology():
    sec = x2_sections()
    status = nv.parse_nvlink_status(sec["status"])
    assert sorted(status) == [0, 1]
    assert status[1]["uuid"] == "GPU-2084a3a6-012e-83c0-a23f-9ece2f7efc77" and status[1]["name"] == "NVIDIA H200"
    for gpu in status.values():
        assert gpu["links"] == {n: {"state": "Active", "speed_gbps": 26.562} for n in range(18)}
    topo = nv.parse_topo_matrix(sec["topo"])
    assert "\x1b[4m" in sec["topo"]  # the real header is underlined with ANSI escapes
    assert topo["devices"] == ["GPU0", "GPU1"]
    assert topo["matrix"] == {"GPU0": {"GPU0": "X", "GPU1": "NV18"}, "GPU1": {"GPU0": "NV18", "GPU1": "X"}}
    assert topo["affinity"]["GPU1"] == {"cpu": "0-31", "numa": "0", "gpu_numa_id": "N/A"}
    assert nv.link_kinds(topo) == {"NV18": 1}


def _x2_state(profile):
    # What that machine is, beyond the recorded profile (which predates NIC and CPU placement): no RDMA
    # NIC beside its GPUs (the topo legend lists none) and both GPUs on CPUs 0-31, NUMA node 0.
    gpu = dict(profile.get("gpu") or {})
    count = int(gpu.get("count", 2))
    profile = dict(profile, nics=[], gpu=dict(gpu, numa_nodes=[0] * count, cpu_affinity=["0-31"] * count))
    sec = x2_sections()
    rows = query_rows_from_xml(nv.parse_query_xml((X2 / "q.xml").read_text()))
    return hwcheck.check_state("h200-x2", hwprofile.resolve(profile), rows,
                                     nv.parse_nvlink_status(sec["status"]), {}, nv.parse_topo_matrix(sec["topo"]))


def test_nvlink_check_on_h200_x2_names_every_slow_link_as_it_did_on_the_machine():
    recorded = json.loads((X2 / "nvlink_state.json").read_text())
    report, failures = _x2_state(recorded["invocation"]["module_args"]["profile"])
    assert failures == ["h200-x2 GPU %d link %d: speed 26.562 GB/s, expected 53.125 GB/s" % (g, n)
                        for g in (0, 1) for n in range(18)]
    assert failures == recorded["failures"]  # what nvlink_check said on the machine itself
    assert report["links_per_gpu"] == {0: {"total": 18, "active": 18}, 1: {"total": 18, "active": 18}}
    assert report["link_kinds"] == {"NV18": 1}


def test_nvlink_check_on_h200_x2_passes_with_the_h200_link_speed():
    profile = {"gpu": {"count": 2, "bus_ids": ["00000000:00:06.0", "00000000:00:07.0"]},
               "nvlink": {"links_per_gpu": 18, "link_speed_gbps": 26.562, "peer_connection": "NV18"},
               "fabric": {"state": "Completed", "status": "Success"}, "driver_version": "580.159.04"}
    assert _x2_state(profile)[1] == []
    _, failures = _x2_state(dict(profile, gpu={"count": 3, "bus_ids": ["00000000:00:06.0", "00000000:00:07.0",
                                                                         "00000000:00:08.0"]}))
    assert failures[0] == "h200-x2: 2 GPUs found, expected 3 (missing PCI 00000000:00:08.0)"


def test_bandwidth_check_on_h200_x2():
    recorded = json.loads((X2 / "nvlink_bw.json").read_text())
    bw = recorded["bandwidth"]
    _, failures = hwcheck.check_bandwidth("h200-x2", recorded["profile"], bw, 300.0)
    assert failures == recorded["failures"] == []
    _, failures = hwcheck.check_bandwidth("h200-x2", recorded["profile"], bw, 400.0)
    assert failures == ["h200-x2 GPU 0 -> GPU 1: 386.2 GB/s, expected at least 400.0 GB/s (peer access True)",
                        "h200-x2 GPU 1 -> GPU 0: 388.9 GB/s, expected at least 400.0 GB/s (peer access True)"]


# --- kv_path_check results recorded on the GPU machines ---------------------------------------------------

def recorded_kv_runs():
    """Each record is `{"variant", "ucx_env", "result": <module JSON over several lines>}`; an empty result is
    a run that printed nothing (kept as None)."""
    runs = []
    for path in (X2 / "kv.jsonl", H100 / "kv_path_variants.jsonl", H100 / "kv_path_variants2.jsonl"):
        for chunk in re.split(r'^(?=\{"variant": )', path.read_text(), flags=re.M):
            if chunk.strip():
                runs.append((path.parent.name, json.loads(re.sub(r'"result": \}\s*$', '"result": null}', chunk))))
    return runs


def test_kv_judging_reproduces_every_recorded_verdict():
    judged = 0
    for machine, run in recorded_kv_runs():
        result = run["result"] or {}
        if "transfer" not in result:
            continue  # the run failed before a transfer (its message is kept in the fixture)
        args = result["invocation"]["module_args"]
        mine = kvpath.judge(result["transfer"], args["min_bandwidth_gbps"], args["expect_rdma"], "WHERE")
        assert [m.split(": ", 1)[1] for m in mine] == [m.split(": ", 1)[1] for m in result["failures"]], run["variant"]
        judged += 1
    assert judged >= 8


def test_kv_transports_of_the_real_runs():
    by_machine = {}
    for machine, run in recorded_kv_runs():
        if "transfer" in (run["result"] or {}):
            by_machine.setdefault(machine, set()).update(run["result"]["transfer"]["transports"])
    assert by_machine["h200-x2"] == {"cuda_ipc/cuda"}  # two processes, two GPUs on NVLink
    assert "tcp/lo" in by_machine["h100-x1"]  # one process on one GPU: UCX fell back to TCP
    two_gpu = [r["result"]["transfer"] for m, r in recorded_kv_runs() if m == "h200-x2"]
    assert len(two_gpu) == 3
    assert all(t["data_ok"] and 250 < t["bandwidth_gbps"] < 400 for t in two_gpu)
    assert kvpath.judge(two_gpu[0], 10.0, True, "x2")[0].startswith("x2: UCX chose cuda_ipc/cuda for the KV")


def test_h200_x1_nixl_loopback_is_judged_too_slow():
    """nixl.txt: a 1 GiB VRAM READ between two agents in one process arrives intact at 0.4 GB/s."""
    runs = re.findall(r"^(\d+) (DONE|ERR) (True|False) ([0-9.]+) GB/s$", (X1 / "nixl.txt").read_text(), re.M)
    assert len(runs) == 3 and all(state == "DONE" and ok == "True" for _, state, ok, _ in runs)
    result = {"data_ok": True, "op": "READ", "mem": "VRAM", "bandwidth_gbps": float(runs[-1][3]), "transports": []}
    assert kvpath.judge(result, 10.0, False, "h200-x1 loopback") == [
        "h200-x1 loopback: NIXL READ VRAM bandwidth 0.40 GB/s, expected at least 10.0 GB/s (UCX transports: unknown)"]


# --- 1 x H100 / 1 x H200 ---------------------------------------------------------------------------------

def test_h100_state_check_against_the_b300_profile_as_recorded():
    sec = hash_sections(H100 / "captures.txt")
    parsed = nv.parse_query_xml(sec["nvidia-smi -q -x"])
    recorded = json.loads((H100 / "nvlink_check_b300.json").read_text())
    rows = nv.parse_query_csv(sec["query"], hwcheck.QUERY_FIELDS)  # captured with nvlink_check's own query
    assert [(r["index"], r["pci.bus_id"], r["fabric.state"]) for r in rows] == [("0", "00000000:00:06.0", "N/A")]
    _, failures = hwcheck.check_state(
        "h100-x1", hwprofile.resolve(recorded["invocation"]["module_args"]["profile"]), rows,
        nv.parse_nvlink_status(sec["nvidia-smi nvlink --status"]), nv.parse_nvlink_errors(sec["nvidia-smi nvlink -e"]),
        nv.parse_topo_matrix(sec["nvidia-smi topo -m"]), version=nv.parse_version(sec["nvidia-smi --version"]))
    assert failures == recorded["failures"]
    assert parsed["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3" and failures[1] == \
        "h100-x1: NVIDIA driver 580.159.04, expected 580.95.05"


def test_h200_x1_query_csv_and_version():
    sec = hash_sections(X1 / "nvlink.txt")
    rows = nv.parse_query_csv(sec["query"])
    assert [(r["index"], r["pci.bus_id"], r["fabric.state"], r["persistence_mode"]) for r in rows] == [
        ("0", "00000000:00:06.0", "N/A", "Enabled")]
    assert nv.parse_version(sec["nvidia-smi --version"])["driver_version"] == "580.159.04"
    assert nv.parse_nvlink_errors(sec["nvidia-smi nvlink -e"]) == {}


# --- gpu_facts, NVML path ----------------------------------------------------------------------------------

class ReplayNvml:
    """libnvidia-ml as the real pynvml binding calls it, answering what the captured machine answered.

    links[gpu][link] is 1/0 for an active/inactive link, or None where NVML said 'Not Supported'.
    """

    def __init__(self, pynvml, links, numa=None):
        self.pynvml, self.links, self.numa = pynvml, links, numa
        self.devices = [pynvml.struct_c_nvmlDevice_t() for _ in links]
        self.calls = []

    def _index(self, device):
        return [ctypes.addressof(d) for d in self.devices].index(ctypes.addressof(device.contents))

    def nvmlInitWithFlags(self, flags):
        self.calls.append("init")
        return 0

    def nvmlShutdown(self):
        self.calls.append("shutdown")
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index, ref):
        if index.value >= len(self.devices):
            return self.pynvml.NVML_ERROR_INVALID_ARGUMENT
        ref._obj.contents = self.devices[index.value]
        return 0

    def nvmlDeviceGetNvLinkState(self, device, link, ref):
        state = self.links[self._index(device)].get(link)
        if state is None:
            return self.pynvml.NVML_ERROR_NOT_SUPPORTED
        ref._obj.value = state
        return 0

    def nvmlDeviceGetNumaNodeId(self, device, ref):
        if self.numa is None:
            return self.pynvml.NVML_ERROR_NOT_SUPPORTED
        ref._obj.value = self.numa
        return 0


@pytest.fixture
def pynvml(monkeypatch):
    mod = requires.module("pynvml", "gpu_facts' NVML path is tested through the real binding (nvidia-ml-py, "
                                    "the test extra)")
    monkeypatch.setattr(mod, "_nvmlGetFunctionPointer_cache", {})
    return mod


def replay_xml(tmp_path, xml):
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\n[ "$1 $2" = "-q -x" ] || exit 2\nexec cat %s\n' % xml)
    smi.chmod(0o755)
    return str(smi)


def run_gpu_facts(monkeypatch, args, sysfs_numa=None):
    module = load("gpu_facts")
    monkeypatch.setattr(module, "sysfs_numa_node", lambda bus_id: sysfs_numa)  # the capture VMs had none
    with patch_module_args(args), pytest.raises(ExitJson) as caught:
        module.main()
    return caught.value.args[0]


def test_gpu_facts_nvml_on_h200_x2_matches_the_run_on_the_machine(tmp_path, monkeypatch, pynvml):
    status = nv.parse_nvlink_status(x2_sections()["status"])
    lib = ReplayNvml(pynvml, [{n: int(link["state"] == "Active") for n, link in status[g]["links"].items()}
                              for g in sorted(status)])
    monkeypatch.setattr(pynvml, "nvmlLib", lib)
    out = run_gpu_facts(monkeypatch, {"nvidia_smi": replay_xml(tmp_path, X2 / "q.xml"), "use_nvml": True})
    recorded = json.loads((X2 / "gpu_facts.json").read_text())
    recorded.pop("invocation")
    assert out == recorded
    assert [g["nvlink_active"] for g in out["gpus"]] == [18, 18] and out["nvml"] is True
    assert lib.calls == ["init", "shutdown"]


def test_gpu_facts_nvml_on_h200_x1_not_supported_link_counts_zero(tmp_path, monkeypatch, pynvml):
    """nvml.txt: NVML says 'Not Supported' for link 0 of the single H200; that means no NVLink, not an error."""
    captured = (X1 / "nvml.txt").read_text()
    assert " link 0 err Not Supported" in captured
    links = {}
    for n, answer in re.findall(r"^ link (\d+) (.+)$", captured, re.M):
        links[int(n)] = None if answer == "err Not Supported" else int(answer == "1")
    lib = ReplayNvml(pynvml, [links], numa=1)
    monkeypatch.setattr(pynvml, "nvmlLib", lib)
    out = run_gpu_facts(monkeypatch, {"nvidia_smi": replay_xml(tmp_path, X1 / "nvidia-smi-q.xml"), "use_nvml": True})
    assert out["nvml"] is True and out["gpus"][0]["nvlink_active"] == 0
    assert out["gpus"][0]["numa_node"] == 1  # sysfs had none, NVML's answer is used
    assert out["gpus"][0]["uuid"] == re.search(r"^0 NVIDIA H200 (\S+)$", captured, re.M).group(1)
    lib.numa = None
    out = run_gpu_facts(monkeypatch, {"nvidia_smi": replay_xml(tmp_path, X1 / "nvidia-smi-q.xml")}, sysfs_numa=0)
    assert out["gpus"][0]["numa_node"] == 0  # sysfs wins; NVML 'Not Supported' for NUMA is not fatal


def test_gpu_facts_without_a_working_nvml_reports_nvml_false(tmp_path, monkeypatch, pynvml):
    def no_library(name, *args, **kwargs):
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "CDLL", no_library)
    out = run_gpu_facts(monkeypatch, {"nvidia_smi": replay_xml(tmp_path, X2 / "q.xml")})
    assert out["nvml"] is False and "nvlink_active" not in out["gpus"][0] and out["gpu_count"] == 2


# --- the real HGX B300 (shared/facts.md: Dell XE9780, driver 610.57.04) -------------------------------------

def test_sysfs_numa_node_of_a_second_pci_domain(monkeypatch):
    """That B300's GPUs span PCI domains 00000000: and 00000001:; sysfs names devices with a 4-digit domain."""
    module = load("gpu_facts")
    opened = []

    def fake_open(path, *args, **kwargs):
        opened.append(path)
        raise FileNotFoundError(path)

    monkeypatch.setattr(module, "open", fake_open, raising=False)
    assert module.sysfs_numa_node("00000001:9B:00.0") is None
    assert module.sysfs_numa_node("00000000:17:00.0") is None
    assert opened == ["/sys/bus/pci/devices/0001:9b:00.0/numa_node", "/sys/bus/pci/devices/0000:17:00.0/numa_node"]


def test_b300_with_a_gpu_missing_as_on_the_real_host():
    """Seven B300 GPUs (one missing, GPUs 0-3 on NUMA 0 and 4-6 on NUMA 1), 18 links at 53.125 GB/s, NV18."""
    rows = [{"index": str(i), "uuid": "GPU-%d" % i, "name": "NVIDIA B300 SXM6 AC",
             "pci.bus_id": "0000000%d:%02X:00.0" % (i // 4, 0x17 + i), "driver_version": "610.57.04",
             "fabric.state": "Completed", "fabric.status": "Success", "ecc.mode.current": "Enabled",
             "ecc.errors.uncorrected.volatile.total": "0"} for i in range(7)]
    status = {i: {"name": "NVIDIA B300 SXM6 AC", "uuid": "GPU-%d" % i,
                  "links": {n: {"state": "Active", "speed_gbps": 53.125} for n in range(18)}} for i in range(7)}
    gpus = ["GPU%d" % i for i in range(7)]
    topo = {"devices": gpus, "matrix": {a: {b: ("X" if a == b else "NV18") for b in gpus} for a in gpus},
            "affinity": {}, "nic_names": {}}
    profile = hwprofile.resolve({"driver_version": "610.57.04", "gpu": {"bus_ids": []}})
    report, failures = hwcheck.check_state("xe9780", profile, rows, status, {}, topo)
    assert failures == ["xe9780: 7 GPUs found, expected 8"]
    assert report["link_kinds"] == {"NV18": 21}
    assert profile["gpu"]["name"] == "NVIDIA B300 SXM6 AC" and profile["gpu"]["memory_mib"] == 275040
    assert profile["nvlink"]["links_per_gpu"] == 18 and profile["nvlink"]["link_speed_gbps"] == 53.125
    assert profile["gpu"]["numa_nodes"] == [0, 0, 0, 0, 1, 1, 1, 1] and profile["gpu"]["power_limit_w"] == 1100
