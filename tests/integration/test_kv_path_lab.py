"""kv_path_check across lab hosts: real NIXL DRAM READs by the decode host from every prefill instance's
GPUs (one per socket) over the lab network, as decode pulls KV from prefill (issue 13 item 3)."""

import pytest

from conftest import LAB_ENV
from inventories import inventory_variant
from pdctl import runner

pytestmark = [pytest.mark.lab, pytest.mark.slow]

READ_TASK = "Decode reads each prefill GPU's blocks (NIXL READ, as decode pulls KV)"
LISTEN_DONE_TASK = "Prefill-side listeners finished cleanly"
# The lab topology is production's: two TP1 DP4 prefill instances per prefill host (GPUs 0-3 on socket 0,
# 4-7 on socket 1), one DP8 decode instance; the emulated B300 puts mlx5_0 by GPU 0 and mlx5_8 by GPU 4.
PATHS = {
    "lab-prefill-0 prefill-0 GPU 0 (NIC mlx5_0) -> lab-decode-0 decode-0 GPU 0": "10.89.64.11",
    "lab-prefill-0 prefill-1 GPU 4 (NIC mlx5_8) -> lab-decode-0 decode-0 GPU 4": "10.89.64.11",
    "lab-prefill-1 prefill-2 GPU 0 (NIC mlx5_0) -> lab-decode-0 decode-0 GPU 0": "10.89.64.12",
    "lab-prefill-1 prefill-3 GPU 4 (NIC mlx5_8) -> lab-decode-0 decode-0 GPU 4": "10.89.64.12",
}


def test_decode_reads_from_every_prefill_instance_on_each_socket_and_names_the_transport(converged_lab, lab):
    # Measured even though the converge just accepted the same host stack (that verdict would be reused).
    result = runner.run_playbook("playbooks/verify_kv_path.yml", lab, envvars=LAB_ENV,
                                 extravars={"pdctl_kv_path_force": True})
    assert result.ok, result.failures
    res = result.task_results(READ_TASK)
    assert set(res) == {"lab-decode-0"}, set(res)  # decode is the initiator: it pulls
    reads = {r["label"]: r for r in res["lab-decode-0"]["results"]}
    assert set(reads) == set(PATHS)
    for label, r in reads.items():
        t = r["transfer"]
        assert t["op"] == "READ" and t["mem"] == "DRAM" and t["data_ok"], label
        assert t["peer_address"] == PATHS[label], (label, t["peer_address"])
        # The lab's ConnectX NICs are emulated outside /sys: the path names its NIC without binding UCX to it.
        assert "UCX_NET_DEVICES" not in t["ucx_env"], t["ucx_env"]
        assert r["bandwidth_gbps"] >= 0.01, (label, r["bandwidth_gbps"])  # the lab's floor (network.yml)
        assert r["transports"] and all(x.startswith("tcp/") for x in r["transports"]), (label, r["transports"])
        print("%s: %.3f GB/s via %s" % (label, r["bandwidth_gbps"], ", ".join(r["transports"])))
    # Each prefill host served one listener per instance (a GPU on each socket), each saw its READs complete.
    done = result.task_results(LISTEN_DONE_TASK)
    assert set(done) == {"lab-prefill-0", "lab-prefill-1"}
    for host, r in done.items():
        items = r["results"]
        assert len(items) == 2 and all(i["finished"] and i["transfer"]["data_ok"] for i in items), (host, items)
        assert sorted(i["item"]["item"]["gpu"] for i in items) == [0, 4]


def test_an_unchanged_host_stack_reports_the_last_verdict_and_a_changed_one_measures(converged_lab, lab):
    again = runner.run_playbook("playbooks/verify_kv_path.yml", lab, envvars=LAB_ENV)
    assert again.ok, again.failures
    assert not again.task_results(READ_TASK), "measured again on an unchanged host stack"
    (reused,) = again.task_results("Report the last accepted verdict (nothing the KV path depends on changed)").values()
    assert "4 paths passed" in reused["msg"], reused["msg"]
    # A changed input (here the UCX environment, as an operator's edit would) measures again.
    changed = runner.run_playbook("playbooks/verify_kv_path.yml", lab, envvars=LAB_ENV,
                                  extravars={"pdctl_ucx_environment": {"UCX_LOG_LEVEL": "warn"}})
    assert changed.ok, changed.failures
    assert set(changed.task_results(READ_TASK)) == {"lab-decode-0"}


def test_expecting_rdma_fails_each_tcp_path_naming_instance_gpu_nic_and_transport(converged_lab, tmp_path):
    inv = inventory_variant(tmp_path / "inv", {"group_vars/all": {"pdctl_kv_path_check": {
        "mem": "DRAM", "size_mb": 16, "expect_rdma": True, "min_bandwidth_gbps": 0.01,
        "gpus": "per_numa", "bind_nics": False}}})
    result = runner.run_playbook("playbooks/verify_kv_path.yml", inv, envvars=LAB_ENV)
    assert not result.ok
    assert {f["host"] for f in result.failures} == {"lab-decode-0"}, result.failures
    res = result.task_results(READ_TASK)["lab-decode-0"]
    msgs = {i["label"]: i["msg"] for i in res["results"]}
    assert set(msgs) == set(PATHS)
    for label, msg in msgs.items():
        # instance, GPU and NIC (the label), then the transport UCX fell back to
        assert msg.startswith(label + ": UCX chose tcp/"), msg
        assert "tcp/eth0" in msg and "expected RDMA" in msg, msg
