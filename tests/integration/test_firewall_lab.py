"""The host firewall on the lab (issue 14, acceptance 2; issue 40, acceptance 2): a fourth container on the lab
network, in no inventory, reaches the front door's port and nothing else; every instance, side-channel, RPC,
router and monitoring port is dropped for it (the connection times out: a closed port without the firewall
would be refused at once). The controller (admin network) cannot connect to an instance's API port (POST
/invocations generates without a key); the router host can. The hosts that must talk still can, and P/D
serving through the front door works, KV pulled from prefill across the firewall."""
import json
import subprocess

import httpx
import pytest
import yaml

from inventories import ROOT
from pdctl import inventory
from pdctl.lab import hosts as lab_hosts

pytestmark = [pytest.mark.lab, pytest.mark.slow]

OUTSIDER = "10.89.64.50"   # on the lab network (hosts.SUBNET), in no inventory
CONTROLLER = "10.89.64.1"  # the lab network's gateway: the admin network
MODEL = "/mnt/model/glm/GLM-5.2-NVFP4"

# Connects to every (address, port) at once, 1 s each: "open", "refused" or "timeout" (dropped).
PROBE = r"""
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor

def probe(target):
    s = socket.socket()
    s.settimeout(1.0)
    try:
        s.connect((target[0], target[1]))
        return "open"
    except socket.timeout:
        return "timeout"
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return "error: %s" % exc
    finally:
        s.close()

targets = json.loads(sys.argv[1])
with ThreadPoolExecutor(128) as pool:
    print(json.dumps([[a, p, r] for (a, p), r in zip(targets, pool.map(probe, targets))]))
"""


def _plan():
    return inventory.plan(ROOT / "inventories/lab")


def planned_ports(plan):
    """{(address, port): what} for every port the plan and the inventory give a lab host."""
    hv = inventory.load(ROOT / "inventories/lab", names=("ansible_host", "pdctl_ports", "pdctl_monitoring"))
    address = {h: v["vars"]["ansible_host"] for h, v in hv.items()}
    ports = {}
    for inst in plan["instances"]:
        ports[(inst["address"], inst["api_port"])] = "%s API" % inst["name"]
        lo, hi = inst["side_channel_ports"]
        for port in range(lo, hi + 1):
            ports[(inst["address"], port)] = "%s NIXL side channel" % inst["name"]
        ports[(inst["address"], inst["dp_rpc_port"])] = "%s DP RPC" % inst["name"]
    for router in plan["routers"]:
        ports[(router["address"], router["port"])] = "router on %s" % router["host"]
        ports[(router["address"], router["metrics_port"])] = "router metrics on %s" % router["host"]
    fd = plan["frontdoor"]
    for host, addr in zip(fd["hosts"], fd["addresses"]):
        ports[(addr, fd["port"])] = "front door on %s" % host
        ports[(addr, fd["metrics_port"])] = "front door metrics on %s" % host
    for host, vars_ in hv.items():
        monitoring, host_ports = vars_["vars"]["pdctl_monitoring"], vars_["vars"]["pdctl_ports"]
        ports[(address[host], 22)] = "SSH on %s" % host
        ports[(address[host], monitoring["node_exporter_port"])] = "node exporter on %s" % host
        if monitoring["dcgm_exporter"]["enabled"]:
            ports[(address[host], monitoring["dcgm_exporter"]["port"])] = "DCGM exporter on %s" % host
        ports[(address[host], monitoring["port"])] = "Prometheus port on %s" % host
        ports[(address[host], host_ports["kv_path_check"])] = "KV-path check on %s" % host
        ports[(address[host], host_ports["model_fanout"])] = "model fan-out on %s" % host
    return ports


def _image():
    return subprocess.run(["podman", "container", "inspect", "--format", "{{.ImageName}}", "lab-decode-0"],
                          capture_output=True, text=True, check=True).stdout.strip()


def _results(stdout):
    return {(a, p): r for a, p, r in json.loads(stdout)}


def probe_from_outsider(targets):
    cmd = ["podman", "run", "--rm", "--network", lab_hosts.NETWORK, "--ip", OUTSIDER, *lab_hosts.container_options(),
           _image(), "python3", "-c", PROBE, json.dumps(sorted(targets))]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return _results(res.stdout)


def probe_from_host(host, targets):
    res = subprocess.run(["podman", "exec", host, "python3", "-c", PROBE, json.dumps(sorted(targets))],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return _results(res.stdout)


def test_an_outsider_reaches_only_the_front_door(converged_lab):
    plan = _plan()
    ports = planned_ports(plan)
    fd = plan["frontdoor"]
    front = {(addr, fd["port"]) for addr in fd["addresses"]}
    found = probe_from_outsider(ports)
    opened = sorted("%s (%s:%d)" % (ports[t], *t) for t, r in found.items() if r == "open")
    assert opened == sorted("%s (%s:%d)" % (ports[t], *t) for t in front), "the outsider reached more than the front door"
    # Dropped by the firewall, not merely closed: a port without a listener would refuse at once.
    not_dropped = sorted("%s (%s:%d): %s" % (ports[t], *t, r) for t, r in found.items()
                         if t not in front and r != "timeout")
    assert not not_dropped, not_dropped


def test_the_hosts_that_must_talk_still_can(converged_lab):
    plan = _plan()
    router = plan["routers"][0]
    prefill = [i for i in plan["instances"] if i["pool"] == "prefill"]
    other_prefill = next(i for i in prefill if i["host"] != prefill[0]["host"])
    # The router host reaches every instance's API; another prefill host does not.
    from_router = probe_from_host(router["host"], [(i["address"], i["api_port"]) for i in plan["instances"]])
    assert set(from_router.values()) == {"open"}, from_router
    from_peer = probe_from_host(other_prefill["host"], [(prefill[0]["address"], prefill[0]["api_port"])])
    assert set(from_peer.values()) == {"timeout"}, from_peer
    # The controller (the admin network) reaches the node exporter; not the DP RPC port, which only the host
    # itself reaches.
    with httpx.Client(timeout=5) as client:
        assert client.get("http://%s:9100/metrics" % prefill[0]["address"]).status_code == 200
    with pytest.raises(httpx.TimeoutException):
        httpx.get("http://%s:%d/" % (prefill[0]["address"], prefill[0]["dp_rpc_port"]), timeout=2)


def test_generation_without_a_key_is_reachable_from_the_router_host_only(converged_lab):
    # vLLM's POST /invocations generates without the API key: from an admin-network address (the controller)
    # the connection is dropped; from the router host it connects (and generates, which is why).
    plan = _plan()
    router = plan["routers"][0]
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
    for inst in plan["instances"]:
        with pytest.raises(httpx.ConnectTimeout):
            httpx.post("http://%s:%d/invocations" % (inst["address"], inst["api_port"]), json=body, timeout=1)
    script = ("import json, sys, urllib.request; r = urllib.request.urlopen(urllib.request.Request(sys.argv[1], "
              "data=json.dumps(%r).encode(), headers={'Content-Type': 'application/json'}), timeout=30); "
              "print(r.status)" % body)
    for inst in plan["instances"]:
        url = "http://%s:%d/invocations" % (inst["address"], inst["api_port"])
        res = subprocess.run(["podman", "exec", router["host"], "python3", "-c", script, url],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and res.stdout.strip() == "200", (url, res.stderr[-500:])


def test_rules_are_loaded_and_kept_across_boots(converged_lab):
    for host in ("lab-prefill-0", "lab-prefill-1", "lab-decode-0"):
        rules = subprocess.run(["podman", "exec", host, "nft", "list", "chain", "inet", "pdctl", "input"],
                               capture_output=True, text=True, check=True).stdout
        assert "policy drop;" in rules and 'comment "ssh"' in rules, host
        enabled = subprocess.run(["podman", "exec", host, "systemctl", "is-enabled", "nftables.service"],
                                 capture_output=True, text=True).stdout.strip()
        assert enabled == "enabled", host


def _client_key():
    clients = yaml.safe_load((ROOT / ".lab/secrets/clients.yml").read_text())
    clients = clients.get("pdctl_frontdoor_clients", clients) if isinstance(clients, dict) else clients
    return next(c["key"] for c in clients if c["name"] != "revoked")


def _kv_pulls(decode):
    # Read on the decode host itself (the firewall admits the instance port from there only); the
    # instance's key goes in on stdin, never on a command line.
    script = ("import sys, urllib.request; key = sys.stdin.read().strip(); "
              "req = urllib.request.Request('http://127.0.0.1:%d/metrics', headers={'Authorization': 'Bearer ' + key}); "
              "print(urllib.request.urlopen(req, timeout=10).read().decode())" % decode["api_port"])
    res = subprocess.run(["podman", "exec", "-i", decode["host"], "python3", "-c", script],
                         input=(ROOT / ".lab/secrets/api-key").read_text(), capture_output=True, text=True, check=True)
    return sum(float(line.rsplit(" ", 1)[1]) for line in res.stdout.splitlines()
               if line.startswith("vllm:nixl_xfer_time_seconds_count"))


def test_pd_serving_through_the_front_door_crosses_the_firewall(converged_lab):
    plan = _plan()
    decode = next(i for i in plan["instances"] if i["pool"] == "decode")
    before = _kv_pulls(decode)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say something about firewalls."}],
            "max_tokens": 16}
    resp = httpx.post(plan["frontdoor"]["url"] + "/v1/chat/completions", json=body, timeout=60,
                      verify=str(ROOT / ".lab/tls/ca.pem"), headers={"Authorization": "Bearer " + _client_key()})
    assert resp.status_code == 200, resp.text[:500]
    message = resp.json()["choices"][0]["message"]
    assert (message.get("content") or message.get("reasoning") or "").strip(), message
    assert _kv_pulls(decode) == before + 1, "decode did not pull KV from a prefill instance across the firewall"
