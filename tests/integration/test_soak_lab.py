"""The soak gate on the lab (issue 37, acceptance 4): it catches the stand-in's leak, which lives in the engine-core
processes as the recipe's did, and passes without it.

The gate (`pdctl gate soak`) runs here, on the controller: load through the front door (TLS, the lab's client
key), each instance's finished requests from its /metrics (reached through an SSH tunnel via the router host: an
instance's port admits the router hosts only) and each unit's memory (API server and engine cores) from the
node exporter of its host, where roles/monitoring's collector writes pdctl_unit_memory_anon_bytes for the
textfile collector. vLLM's process_resident_memory_bytes (the API server's) would be recorded beside it, but in
the recipe's configuration vLLM exports none (multiprocess registry), so only the unit's memory shows the leak.
The leak goes on FAULTY's instances (prefill-2, prefill-3) as an operator would change the engine profile (test_faults_lab.faulty_inventory); the lab's own profile comes
back at the end (restore_engine). Reports under artifacts/soak/."""
import json
import os
import socket
import subprocess
import time

import pytest

from inventories import ROOT
from pdctl.gates import cli
from pdctl.lab.hosts import ADMIN_USER
from test_faults_lab import FAULTY, apply_vllm, faulty_inventory, restore_engine  # noqa: F401 (a fixture)
from test_serving import CA, FRONTDOOR, client_key

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROUTER_HOST = "10.89.64.13"  # lab-decode-0: a router host, whose traffic the instances' ports admit
FAULTY_ADDRESS = "10.89.64.12"
INSTANCES = {"prefill-2": 8100, "prefill-3": 8101}  # FAULTY's instances and their API ports
NODE_EXPORTER = "http://%s:9100/metrics" % FAULTY_ADDRESS
SETTINGS = ["--duration", "50", "--warmup", "10", "--sample-interval", "1", "--concurrency", "4",
            "--max-rss-slope", "20"]
LEAK_MB_PER_REQUEST = 0.5


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tunnels():
    """{instance: local URL} of FAULTY's instances, through SSH port forwards via the router host."""
    local = {name: _free_port() for name in INSTANCES}
    forwards = [arg for name, port in INSTANCES.items()
                for arg in ("-L", "127.0.0.1:%d:%s:%d" % (local[name], FAULTY_ADDRESS, port))]
    proc = subprocess.Popen(["ssh", "-N", "-i", str(ROOT / ".lab/ssh/id_ed25519"), "-o", "BatchMode=yes",
                             "-o", "ExitOnForwardFailure=yes", "-o", "UserKnownHostsFile=%s" % (ROOT / ".lab/ssh/known_hosts"),
                             *forwards, "%s@%s" % (ADMIN_USER, ROUTER_HOST)])
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                for port in local.values():
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "SSH tunnel via %s failed" % ROUTER_HOST
                time.sleep(0.2)
        yield {name: "http://127.0.0.1:%d" % port for name, port in local.items()}
    finally:
        proc.terminate()
        proc.wait(10)


def _soak(tunnels, name, capsys, monkeypatch):
    monkeypatch.setenv("PDCTL_API_KEY", client_key())
    out = ROOT / "artifacts" / "soak" / name
    specs = ["--instance=%s=%s,%s" % (inst, url, NODE_EXPORTER) for inst, url in tunnels.items()]
    rc = cli.main(["soak", "--router-url", FRONTDOOR, "--ca-file", CA, *specs, "--artifacts", str(out), *SETTINGS])
    printed = capsys.readouterr()
    result = json.loads((out / "soak.json").read_text())
    figures = {"scenario": name, "rc": rc, "passed": result["passed"], "failures": result["failures"],
               "requests": result["requests"]["total"], "failed": result["requests"]["failed"],
               "instances": {n: {k: i[k] for k in ("requests_served", "rss_start_mb", "rss_end_mb",
                                                  "rss_slope_mb_per_1k", "rss_slope_ci95",
                                                  "api_server_rss_slope_mb_per_1k")}
                             for n, i in result["instances"].items()}}
    with capsys.disabled():
        print("\n" + printed.out + printed.err + json.dumps(figures))
    return rc, result, printed


def test_soak_passes_without_the_leak(converged_lab, tunnels, capsys, monkeypatch):
    rc, result, printed = _soak(tunnels, "no-leak", capsys, monkeypatch)
    assert rc == 0, printed.err
    for name, inst in result["instances"].items():
        assert inst["requests_served"] > 50, name
        assert inst["samples"] >= 30 and abs(inst["rss_slope_mb_per_1k"]) < 20, (name, inst)


def test_soak_catches_the_engine_core_leak(converged_lab, restore_engine, tunnels, tmp_path, capsys, monkeypatch):
    result, _ = apply_vllm(faulty_inventory(tmp_path, "leak", {"leak_rss_mb_per_request": LEAK_MB_PER_REQUEST}))
    assert result.ok, result.failures
    assert result.total("changed") > 0, "the leak profile did not reach the instances"
    rc, result, printed = _soak(tunnels, "engine-core-leak", capsys, monkeypatch)
    assert rc == cli.EXIT_FAILED
    for name, inst in result["instances"].items():
        # ~500 MB per 1,000 requests in the unit's memory (the engine cores) ...
        assert inst["rss_slope_mb_per_1k"] == pytest.approx(1000 * LEAK_MB_PER_REQUEST, rel=0.3), (name, inst)
        assert inst["rss_slope_ci95"][0] > 20
        assert "%s: RSS grows" % name in printed.err
        # ... and vLLM itself exports no memory of its API server in the recipe's configuration (-dp 4 / -dp 8: one
        # API server per DP rank, /metrics on the multiprocess registry, no process_* series): nothing to fit.
        assert inst["api_server_rss_slope_mb_per_1k"] is None, (name, inst)
    assert result["requests"]["failed"] == 0
    assert os.path.getsize(ROOT / "artifacts/soak/engine-core-leak/soak.png") > 10000
