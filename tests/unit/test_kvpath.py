"""kv_path_check: real NIXL DRAM transfers on this CPU-only machine (loopback, and listener/initiator
in two processes over 127.0.0.1), UCX transport detection, and the judging rules.

The transfer tests need NIXL (`nixl` fixture: a failure in CI when it is missing); the parser and judging
tests need nothing but the captures."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest
from pathlib import Path
from test_hw_modules import ExitJson, FailJson, raising_exits, run  # noqa: F401  (fixture re-used)
from test_hw_support import FIXTURES

import requires
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import kvpath as kv

WORKER = Path(kv.__file__)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def nixl():
    return requires.module("nixl_cu13", "scripts/bootstrap installs nixl-cu13 for the real DRAM transfers")


def base(**args):
    return dict(python=sys.executable, mem="DRAM", size_mb=8, iterations=2, host_label="lab-prefill-0", **args)


def test_dram_loopback_through_module(nixl):
    out = run("kv_path_check", base(min_bandwidth_gbps=0.01))
    assert out["transfer"]["data_ok"] is True and out["transfer"]["mem"] == "DRAM"
    assert out["bandwidth_gbps"] > 0.01 and out["latency_us"] > 0
    assert out["transports"] and all("/" in t for t in out["transports"])
    assert "tcp" not in kv.transport_kinds(out["transports"])  # same host: shared memory (cma)


def test_low_bandwidth_fails(nixl):
    out = run("kv_path_check", base(min_bandwidth_gbps=100000.0), FailJson)
    assert out["msg"].startswith("lab-prefill-0 loopback: NIXL READ DRAM bandwidth ")
    assert "expected at least 100000.0 GB/s (UCX transports: " in out["msg"]


def test_tcp_fallback_when_rdma_expected(nixl):
    out = run("kv_path_check", base(min_bandwidth_gbps=0.001, expect_rdma=True, ucx_env={"UCX_TLS": "tcp,self"}),
              FailJson)
    assert any(t.startswith("tcp/") for t in out["transports"])
    assert "UCX chose tcp/" in out["msg"] and "expected RDMA" in out["msg"]


def test_cross_host_dram_two_processes(nixl):
    """Listener in another process (as on the decode host), initiator through the module."""
    port = free_port()
    listener = subprocess.Popen([sys.executable, str(WORKER), "listener", "--bind", "127.0.0.1", "--port", str(port),
                                 "--mem", "DRAM", "--size-mb", "8", "--timeout", "60"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = run("kv_path_check", base(role="initiator", peer="127.0.0.1", port=port, op="WRITE",
                                        min_bandwidth_gbps=0.001))
        assert out["transfer"]["data_ok"] is True and out["transfer"]["op"] == "WRITE"
        assert out["transfer"]["peer"].startswith("pdctl-kv-target-")
        text, _ = listener.communicate(timeout=60)
    finally:
        listener.kill()
    assert listener.returncode == 0
    assert '"initiator_address": "127.0.0.1"' in text and '"data_ok": true' in text


def test_cross_host_read_in_process_listener(nixl):
    port = free_port()
    box = {}
    thread = threading.Thread(target=lambda: box.update(kv.run_listener("127.0.0.1", port, "DRAM", 4, timeout=60)))
    thread.start()
    result = kv.run_initiator("127.0.0.1", port, "DRAM", "READ", iterations=2, timeout=60)
    thread.join(60)
    assert result["data_ok"] and box["data_ok"] and box["bandwidth_gbps"] == result["bandwidth_gbps"]


def test_listener_times_out_clearly(nixl):
    out = run("kv_path_check", base(role="listener", bind="127.0.0.1", port=free_port(), timeout=1), FailJson)
    assert "no initiator connected to 127.0.0.1:" in out["msg"] and out["msg"].startswith("lab-prefill-0 (listener)")


@pytest.mark.parametrize("role,extra", [("listener", {}), ("initiator", {"peer": "127.0.0.1"})])
def test_listener_and_initiator_need_the_planned_port(role, extra):
    # No port of its own: the KV-path check passes pdctl_ports.kv_path_check + n (loopback needs none).
    out = run("kv_path_check", base(role=role, **extra), FailJson)
    assert "port" in out["msg"] and role in out["msg"]


def test_proto_info_of_real_h100_run():
    """The H100 device run: VRAM READ served by 'software emulation' over tcp/lo at 0.4 GB/s."""
    text = (FIXTURES / "h100-x1" / "kv_proto_default.txt").read_text()
    agent = next(b["worker"] for b in kv.parse_proto_info(text) if b["worker"].startswith("pdctl-kv-initiator"))
    assert kv.transports_used(kv.parse_proto_info(text), agent, "READ", 256 << 20) == ["tcp/lo"]
    result = {"data_ok": True, "op": "READ", "mem": "VRAM", "bandwidth_gbps": 0.41, "transports": ["tcp/lo"]}
    assert kv.judge(result, 10.0, False, "h100-x1 loopback") == [
        "h100-x1 loopback: NIXL READ VRAM bandwidth 0.41 GB/s, expected at least 10.0 GB/s (UCX transports: tcp/lo)"]


def test_judge_rdma_rules():
    ok = {"data_ok": True, "op": "READ", "mem": "VRAM", "bandwidth_gbps": 45.0, "transports": ["rc_mlx5/mlx5_0:1"]}
    assert kv.judge(ok, 20, True, "p -> d") == []
    assert kv.judge(dict(ok, transports=[]), 20, True, "p -> d")[0].startswith("p -> d: could not tell")
    assert kv.parse_range("8K..inf") == (8192, float("inf")) and kv.parse_range("0") == (0, 0)


def test_transports_found_when_ucx_truncates_the_worker_name():
    """Captured on the lab: lab-prefill-0 writing to lab-decode-0; UCX prints the worker name cut short."""
    text = (FIXTURES / "lab" / "ucx-proto-info-tcp-cross-host.txt").read_text()
    blocks = kv.parse_proto_info(text)
    assert any(b["worker"] == "pdctl-kv-initiator-lab-prefill-" for b in blocks)
    assert kv.transports_used(blocks, "pdctl-kv-initiator-lab-prefill-0-14760", "WRITE", 16 << 20) == ["tcp/eth0"]
    assert kv.transports_used(blocks, "some-other-agent", "WRITE", 16 << 20) == []
