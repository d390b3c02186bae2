"""kv_path_check across lab hosts: a real NIXL DRAM transfer, prefill host -> decode host over the lab network."""
import json

import pytest

from conftest import LAB_ENV
from inventories import inventory_variant
from pdctl import runner

pytestmark = [pytest.mark.lab, pytest.mark.slow]


def module_results(result, task):
    out = {}
    for path in (result.artifact_dir / "job_events").glob("*.json"):
        event = json.loads(path.read_text())
        data = event.get("event_data") or {}
        if event.get("event") in ("runner_on_ok", "runner_on_failed") and data.get("task") == task:
            out[data["host"]] = data["res"]
    return out


def test_each_prefill_host_moves_kv_to_decode_and_names_the_transport(converged_lab, lab):
    result = runner.run_playbook("playbooks/verify_kv_path.yml", lab, envvars=LAB_ENV)
    assert result.ok, result.failures
    res = module_results(result, "Each prefill host writes KV-sized blocks to the decode host")
    assert set(res) == {"lab-prefill-0", "lab-prefill-1"}
    for host, r in res.items():
        assert r["transfer"]["data_ok"] and r["transfer"]["peer_address"] == "10.89.64.13"
        assert r["bandwidth_gbps"] > 0.05
        assert r["transports"] and all(t.startswith("tcp/") for t in r["transports"]), r["transports"]
        print("%s -> lab-decode-0: %.3f GB/s via %s" % (host, r["bandwidth_gbps"], ", ".join(r["transports"])))


def test_expecting_rdma_fails_on_a_tcp_path(converged_lab, tmp_path):
    inv = inventory_variant(tmp_path / "inv", {"group_vars/all": {"pdctl_kv_path_check": {
        "mem": "DRAM", "size_mb": 16, "expect_rdma": True, "min_bandwidth_gbps": 0.01}}})
    result = runner.run_playbook("playbooks/verify_kv_path.yml", inv, envvars=LAB_ENV)
    assert not result.ok
    failed = {f["host"]: str(f["msg"]) for f in result.failures}
    assert set(failed) == {"lab-prefill-0", "lab-prefill-1"}
    for host, msg in failed.items():
        assert host in msg and "tcp/eth0" in msg
