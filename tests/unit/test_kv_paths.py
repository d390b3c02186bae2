"""Issue 13 item 3: the KV-path check proves every path that serves. Decode READs from one GPU per socket of
every prefill instance, each side bound to its instance's UCX_NET_DEVICES, and a failure names the instance,
the GPU, the NIC and the transport. The judging runs on the real two-GPU NVLink capture (h200-x2), and the
playbook itself runs offline here with real NIXL DRAM transfers (two inventory hosts on this machine)."""
from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import requires
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import kvpath, topology
from inventories import B300, ROOT, inventory_variant
from pdctl import inventory
from test_hw_captures import recorded_kv_runs

SWITCH_MGMT = {"mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5"}


def b300_plan(**overrides):
    hosts = inventory.load(B300)
    for h in hosts.values():
        h["vars"].update(overrides)
    return topology.build_plan(hosts)


def test_each_prefill_instance_is_read_from_a_gpu_on_each_socket_through_its_own_nics():
    paths = topology.kv_check_paths(b300_plan(), 5690)
    assert [(p["prefill_host"], p["prefill_instance"], p["gpu"], p["nics"]) for p in paths] == [
        ("b300-prefill-0", "prefill-0", 0, ["mlx5_0"]), ("b300-prefill-0", "prefill-1", 4, ["mlx5_8"]),
        ("b300-prefill-1", "prefill-2", 0, ["mlx5_0"]), ("b300-prefill-1", "prefill-3", 4, ["mlx5_8"])]
    by_instance = {p["prefill_instance"]: p for p in paths}
    assert by_instance["prefill-0"]["ucx_net_devices"] == "mlx5_0:1,mlx5_1:1,mlx5_6:1,mlx5_7:1"
    assert by_instance["prefill-3"]["ucx_net_devices"] == "mlx5_8:1,mlx5_9:1,mlx5_10:1,mlx5_11:1"
    for p in paths:
        assert p["decode_host"] == "b300-decode-0" and p["decode_instance"] == "decode-0"
        assert p["decode_gpu"] == p["gpu"]  # the decode GPU on the same socket
        assert p["prefill_address"] == {"b300-prefill-0": "192.0.2.11", "b300-prefill-1": "192.0.2.12"}[p["prefill_host"]]
        used = {d.split(":")[0] for d in (p["ucx_net_devices"] + "," + p["decode_ucx_net_devices"]).split(",")}
        assert not used & SWITCH_MGMT
    # Listener ports on each prefill host: one per path there, from the base.
    assert [p["port"] for p in paths] == [5690, 5691, 5690, 5691]
    assert paths[1]["name"] == "b300-prefill-0 prefill-1 GPU 4 (NIC mlx5_8) -> b300-decode-0 decode-0 GPU 4"


def test_an_instance_spanning_both_sockets_is_checked_on_each_and_all_checks_every_gpu():
    hosts = inventory.load(B300)
    for name in ("b300-prefill-0", "b300-prefill-1"):
        hosts[name]["vars"]["pdctl_pools"] = {"prefill": {"tensor_parallel_size": 1, "data_parallel_size": 8},
                                              "decode": {"tensor_parallel_size": 1, "data_parallel_size": 8}}
        hosts[name]["vars"]["pdctl_instances"] = [{"pool": "prefill"}]
    plan = topology.build_plan(hosts)
    paths = [p for p in topology.kv_check_paths(plan, 5690) if p["prefill_host"] == "b300-prefill-0"]
    assert [(p["gpu"], p["numa"], p["nics"]) for p in paths] == [(0, 0, ["mlx5_0"]), (4, 1, ["mlx5_8"])]
    every = [p for p in topology.kv_check_paths(b300_plan(), 5690, "all") if p["prefill_host"] == "b300-prefill-1"]
    assert [p["gpu"] for p in every] == list(range(8)) and [p["port"] for p in every] == list(range(5690, 5698))
    assert [p["nics"][0] for p in every] == ["mlx5_0", "mlx5_1", "mlx5_6", "mlx5_7",
                                             "mlx5_8", "mlx5_9", "mlx5_10", "mlx5_11"]
    with pytest.raises(ValueError, match="per_numa, all"):
        topology.kv_check_paths(b300_plan(), 5690, "first")


# --- judging on the real two-GPU NVLink capture ------------------------------------------------------------

def h200_reads():
    return [r["result"]["transfer"] for m, r in recorded_kv_runs() if m == "h200-x2"]


LABEL = "h200-x2 prefill-0 GPU 0 (NIC mlx5_0) -> h200-x2 decode-0 GPU 1"


def test_real_nvlink_reads_pass_a_floor_under_their_measured_bandwidth():
    reads = h200_reads()
    assert [t["op"] for t in reads] == ["READ"] * 3 and all(t["mem"] == "VRAM" for t in reads)
    assert sorted(round(t["bandwidth_gbps"]) for t in reads) == [270, 270, 292]
    for t in reads:
        assert kvpath.judge(t, 250.0, False, LABEL) == []


def test_a_floor_above_the_real_reads_fails_naming_instance_gpu_nic_and_transport():
    slow = min(h200_reads(), key=lambda t: t["bandwidth_gbps"])
    (msg,) = kvpath.judge(slow, 300.0, False, LABEL)
    assert msg == ("h200-x2 prefill-0 GPU 0 (NIC mlx5_0) -> h200-x2 decode-0 GPU 1: NIXL READ VRAM bandwidth "
                   "269.92 GB/s, expected at least 300.0 GB/s (UCX transports: cuda_ipc/cuda)")


def test_a_tcp_fallback_fails_naming_instance_gpu_nic_and_transport():
    fallback = dict(h200_reads()[0], transports=["tcp/eth0"], bandwidth_gbps=1.2)
    msgs = kvpath.judge(fallback, 20.0, True, LABEL)
    assert len(msgs) == 2 and all(m.startswith(LABEL + ": ") for m in msgs)
    assert "bandwidth 1.20 GB/s" in msgs[0] and "tcp/eth0" in msgs[0]
    assert "UCX chose tcp/eth0 for the KV transfer, expected RDMA" in msgs[1]


# --- the playbook: structure, then a real offline run --------------------------------------------------------

def test_playbook_reads_from_decode_per_path_with_each_instances_nics():
    plays = yaml.safe_load((ROOT / "playbooks/verify_kv_path.yml").read_text())
    (measure,) = [t for t in plays[0]["tasks"] if "ansible.builtin.include_tasks" in t]
    assert "not verify_kv_reuse" in measure["when"]  # a verdict that still holds is reported, not measured
    included = yaml.safe_load((ROOT / "playbooks" / measure["ansible.builtin.include_tasks"]).read_text())
    tasks = {t["name"]: t for t in included}
    (listener,) = [t for t in tasks.values() if t.get("pdctl.vllm_pd.kv_path_check", {}).get("role") == "listener"]
    (initiator,) = [t for t in tasks.values() if t.get("pdctl.vllm_pd.kv_path_check", {}).get("role") == "initiator"]
    assert initiator["pdctl.vllm_pd.kv_path_check"]["op"] == "READ"
    # Each end runs on its own host (delegated where that host is outside a --limit run).
    assert initiator["delegate_to"] == "{{ item.decode_host }}" and listener["delegate_to"] == "{{ item.prefill_host }}"
    assert "decode_host" in plays[0]["vars"][initiator["loop"].strip("{} ")]
    assert "prefill_host" in plays[0]["vars"][listener["loop"].strip("{} ")]
    assert "item.ucx_net_devices" in listener["pdctl.vllm_pd.kv_path_check"]["ucx_env"]
    assert "item.decode_ucx_net_devices" in initiator["pdctl.vllm_pd.kv_path_check"]["ucx_env"]
    assert listener["pdctl.vllm_pd.kv_path_check"]["gpu"] == "{{ item.gpu }}"
    # b300's check settings are the defaults layer's; the lab sets its own.
    for inv, path in (("b300", "roles/pdctl_defaults/defaults/main/network.yml"),
                      ("lab", "inventories/lab/group_vars/all/network.yml")):
        check = yaml.safe_load((ROOT / path).read_text())["pdctl_kv_path_check"]
        assert check["gpus"] == "per_numa"
        assert check["bind_nics"] is (inv == "b300") and check["expect_rdma"] is (inv == "b300")


def _free_base(count):
    for _ in range(50):
        base = random.randint(20000, 40000)
        try:
            socks = []
            for port in range(base, base + count):
                s = socket.socket()
                s.bind(("0.0.0.0", port))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports")


def run_offline(tmp_path, check, *args):
    """verify_kv_path.yml on two inventory hosts that are this machine (prefill 127.0.0.2, decode 127.0.0.3);
    args go to ansible-playbook."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "ansible_become": False}
    hosts = {"all": {"children": {
        "serving": {"children": {
            "prefill": {"hosts": {"lab-prefill-0": dict(local, pdctl_advertise_address="127.0.0.2")}},
            "decode": {"hosts": {"lab-decode-0": dict(local, pdctl_advertise_address="127.0.0.3")}}}},
        "router": {"hosts": {"lab-decode-0": {}}}}}}
    # Production's ports (the defaults layer's, as the planner sees them).
    ports = next(iter(inventory.load(ROOT / "inventories/b300", names=("pdctl_ports",)).values()))["vars"]["pdctl_ports"]
    inv = inventory_variant(tmp_path / "inv", {"hosts": hosts, "group_vars/all": {
        "pdctl_ports": dict(ports, kv_path_check=_free_base(2)),
        "pdctl_kv_path_check": dict({"mem": "DRAM", "size_mb": 8, "expect_rdma": False, "min_bandwidth_gbps": 0.001,
                                     "gpus": "per_numa", "bind_nics": False, "python": sys.executable}, **check)}})
    res = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/verify_kv_path.yml",
                          "-i", str(inv), *args], cwd=ROOT, capture_output=True, text=True,
                         env={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": "/usr/bin:/bin",
                              "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "HOME": str(tmp_path),
                              "ANSIBLE_ASYNC_DIR": str(tmp_path / "async"),
                              "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json", "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"})
    out = json.loads(res.stdout[res.stdout.index("{"):])
    # One entry per task and host batch: the json callback may list a task once per host (merged here).
    tasks = {}
    for t in out["plays"][0]["tasks"]:
        tasks.setdefault(t["task"]["name"], {}).update(t["hosts"])
    return res.returncode, tasks, res.stdout + res.stderr


def test_offline_run_reads_every_instance_path_and_reports_each(tmp_path):
    requires.module("nixl_cu13", "scripts/bootstrap installs nixl-cu13 for the real DRAM transfers")
    rc, tasks, text = run_offline(tmp_path, {})
    assert rc == 0, text
    reads = tasks["Decode reads each prefill GPU's blocks (NIXL READ, as decode pulls KV)"]["lab-decode-0"]["results"]
    assert [r["label"] for r in reads] == [
        "lab-prefill-0 prefill-0 GPU 0 (NIC mlx5_0) -> lab-decode-0 decode-0 GPU 0",
        "lab-prefill-0 prefill-1 GPU 4 (NIC mlx5_8) -> lab-decode-0 decode-0 GPU 4"]
    for r in reads:
        assert r["transfer"]["op"] == "READ" and r["transfer"]["data_ok"] and r["transfer"]["peer_address"] == "127.0.0.2"
        assert r["bandwidth_gbps"] > 0.001 and r["transports"]
        assert "UCX_NET_DEVICES" not in r["transfer"]["ucx_env"]  # bind_nics false: the lab's NICs are emulated
    listeners = tasks["Prefill-side listeners finished cleanly"]["lab-prefill-0"]["results"]
    assert len(listeners) == 2 and all(r["finished"] and r["transfer"]["data_ok"] for r in listeners)


def test_a_run_limited_to_one_end_checks_its_paths_from_the_other(tmp_path):
    """--limit to the prefill host (host maintenance): the decode host outside the play still reads its paths."""
    requires.module("nixl_cu13", "scripts/bootstrap installs nixl-cu13 for the real DRAM transfers")
    for host in ("lab-prefill-0", "lab-decode-0"):
        rc, tasks, text = run_offline(tmp_path / host, {}, "--limit", host)
        assert rc == 0, text
        reads = tasks["Decode reads each prefill GPU's blocks (NIXL READ, as decode pulls KV)"][host]["results"]
        assert len(reads) == 2 and all(r["transfer"]["data_ok"] for r in reads), reads
        listeners = tasks["Prefill-side listeners finished cleanly"][host]["results"]
        assert len(listeners) == 2 and all(r["finished"] for r in listeners)


def test_offline_run_fails_naming_each_path_below_the_floor(tmp_path):
    requires.module("nixl_cu13", "scripts/bootstrap installs nixl-cu13 for the real DRAM transfers")
    rc, tasks, text = run_offline(tmp_path, {"min_bandwidth_gbps": 100000.0})
    assert rc != 0, text
    reads = tasks["Decode reads each prefill GPU's blocks (NIXL READ, as decode pulls KV)"]["lab-decode-0"]["results"]
    msgs = [r["msg"] for r in reads]
    assert len(msgs) == 2 and all(r["failed"] for r in reads)
    assert msgs[1].startswith("lab-prefill-0 prefill-1 GPU 4 (NIC mlx5_8) -> lab-decode-0 decode-0 GPU 4: NIXL READ "
                              "DRAM bandwidth "), msgs
    assert "expected at least 100000.0 GB/s (UCX transports: " in msgs[1]
