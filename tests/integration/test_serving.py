"""Serving on the lab: P/D through the front door and the real router, restart isolation, pre-switch
validation, secrets."""
import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from conftest import LAB_ENV
from inventories import ROOT, inventory_variant, group_var
from pdctl import cli, outcome, runner

pytestmark = [pytest.mark.lab, pytest.mark.slow]

# Clients come in through the front door (TLS with the lab's CA, a client key); the router behind it
# listens on the decode host's loopback only.
FRONTDOOR = "https://10.89.64.13:8443"
CA = str(ROOT / ".lab/tls/ca.pem")
DECODE = "http://10.89.64.13:8100"
# The instances' API ports admit the router host (and the instance's own) only: vLLM's POST /invocations
# generates without a key. What the tests read from an instance directly, they read from there.
ROUTER_HOST = "lab-decode-0"
MODEL = "/mnt/model/glm/GLM-5.2-NVFP4"
INSTANCES = {"lab-prefill-0": ["prefill-0", "prefill-1"], "lab-prefill-1": ["prefill-2", "prefill-3"],
             "lab-decode-0": ["decode-0"]}


def api_key():
    """The deployment key: what the router (and the front door) present to the instances."""
    return (ROOT / ".lab/secrets/api-key").read_text().strip()


def client_key(name="tester"):
    """A front-door client's key (.lab/secrets/clients.yml, made by `pdctl-lab up`)."""
    return {c["name"]: c["key"] for c in yaml.safe_load((ROOT / ".lab/secrets/clients.yml").read_text())}[name]


def on_host(host, *argv):
    return subprocess.run(["podman", "exec", host, *argv], capture_output=True, text=True, check=True).stdout


def main_pids():
    pids = {}
    for host, names in INSTANCES.items():
        for name in names:
            pids[name] = on_host(host, "systemctl", "show", "-p", "MainPID", "--value",
                                 "pdctl-vllm-%s.service" % name).strip()
    return pids


# GET url from inside a lab host: prints the status and the body (key on stdin, never on a command line).
GET_ON_HOST = ("import sys, urllib.error, urllib.request; key = sys.stdin.read().strip()\n"
               "try:\n"
               "    r = urllib.request.urlopen(urllib.request.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + key}), timeout=10)\n"
               "    print(r.status); print(r.read().decode())\n"
               "except (urllib.error.URLError, OSError) as exc:\n"
               "    print(getattr(exc, 'code', 0))\n")


def get_on_host(host, url):
    """(status, body) of GET url from inside host (0: no answer)."""
    res = subprocess.run(["podman", "exec", "-i", host, "python3", "-c", GET_ON_HOST, url], input=api_key(),
                         capture_output=True, text=True, timeout=60, check=True)
    status, _, body = res.stdout.partition("\n")
    return int(status), body


def kv_pulls():
    status, text = get_on_host(ROUTER_HOST, DECODE + "/metrics")
    assert status == 200, status
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:nixl_xfer_time_seconds_count"))


def test_streamed_chat_through_the_front_door_pulls_kv_from_prefill(converged_lab):
    before = kv_pulls()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say something about GPUs."}],
            "max_tokens": 16, "stream": True}
    tokens = []
    with httpx.stream("POST", FRONTDOOR + "/v1/chat/completions", json=body, timeout=60, verify=CA,
                      headers={"Authorization": "Bearer " + client_key()}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", []):
                    tokens.append(choice["delta"].get("content") or "")
    assert "".join(tokens).strip(), "no tokens streamed"
    assert kv_pulls() == before + 1, "decode did not pull KV from a prefill instance"


def test_changing_one_instance_restarts_only_that_instance(converged_lab, tmp_path):
    before = main_pids()
    moved = inventory_variant(tmp_path / "inv", {"host_vars/lab-prefill-0": {
        "pdctl_instances": [{"pool": "prefill"}, {"pool": "prefill", "api_port": 8111}]}})
    try:
        result = runner.run_playbook("site.yml", moved, envvars=LAB_ENV, tags="vllm,router")
        assert result.ok, result.failures
        after = main_pids()
        assert after["prefill-1"] != before["prefill-1"], "the changed instance was not restarted"
        assert {k: v for k, v in after.items() if k != "prefill-1"} == \
               {k: v for k, v in before.items() if k != "prefill-1"}, "an unchanged instance was restarted"
        assert on_host("lab-prefill-0", "ss", "-ltn", "sport = :8111").count("LISTEN") == 1
    finally:
        # Back on the hosts the change touched: prefill-1's and the router's (each host's units hold only
        # its own instances). The change itself runs everywhere: nothing else may restart.
        restored = runner.run_playbook("site.yml", ROOT / "inventories/lab", envvars=LAB_ENV, tags="vllm,router",
                                       limit="lab-prefill-0,lab-decode-0")
        assert restored.ok, restored.failures


def test_unknown_flag_is_rejected_before_anything_switches(converged_lab, tmp_path):
    serve_args = group_var("b300", "pdctl_serve_args")
    serve_args["prefill"].append("--no-such-flag")
    bad = inventory_variant(tmp_path / "inv", {"group_vars/all": {"pdctl_serve_args": serve_args}})
    units_before = {h: on_host(h, "sh", "-c", "sha256sum /etc/systemd/system/pdctl-vllm-*.service") for h in INSTANCES}
    pids_before = main_pids()
    result = runner.run_playbook("site.yml", bad, envvars=LAB_ENV, tags="vllm")
    assert not result.ok
    failed = {f["host"]: f for f in result.failures}
    assert set(failed) == {"lab-prefill-0", "lab-prefill-1"}
    for f in failed.values():
        assert f["task"] == "Instance arguments parse with the release being installed"
    stderr = [r for r in json.dumps([f["msg"] for f in failed.values()]).split("\\n")]
    assert result.total("changed") == 0
    assert main_pids() == pids_before, "a running instance was touched"
    assert {h: on_host(h, "sh", "-c", "sha256sum /etc/systemd/system/pdctl-vllm-*.service") for h in INSTANCES} \
        == units_before
    events = "".join(p.read_text() for p in (result.artifact_dir / "job_events").glob("*.json"))
    assert "unrecognized arguments: --no-such-flag" in events, stderr


def test_secrets_appear_only_in_the_protected_secrets_files(converged_lab, second_run, tmp_path):
    key = api_key()
    hub_token = (ROOT / ".lab/secrets/hf-token").read_text().strip()
    # The runner's artifacts of a full converge (and its saved result, when scripts/test ran it) and of a
    # second run with --diff (through `pdctl run`: its JSON summary, JUnit file and console output too), and
    # the gate reports.
    assert second_run.ok
    reports = [second_run.json_path, second_run.junit_path, *second_run.outputs]
    if os.environ.get("PDCTL_FIRST_CONVERGE"):
        reports.append(Path(os.environ["PDCTL_FIRST_CONVERGE"]))
    for artifacts in (converged_lab.artifact_dir, second_run.artifact_dir, ROOT / "artifacts" / "gates"):
        reports += list(artifacts.rglob("*"))
    for path in (p for p in reports if p.is_file() and p.suffix != ".png"):
        text = path.read_text(errors="replace")
        assert key not in text, "API key in runner artifact %s" % path
        assert hub_token not in text, "Hub token in runner artifact %s" % path
    # Everything pdctl render writes.
    assert cli.main(["render", "-i", str(ROOT / "inventories/lab"), "--out", str(tmp_path / "r")]) == 0
    for path in (tmp_path / "r").rglob("*"):
        if path.is_file():
            assert key not in path.read_text(), path
    # No process on any host carries a secret in its argv (world-readable in /proc/*/cmdline).
    clients = [c["key"] for c in yaml.safe_load((ROOT / ".lab/secrets/clients.yml").read_text())]
    for host in INSTANCES:
        cmdlines = on_host(host, "sh", "-c", "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done")
        assert len(cmdlines.splitlines()) > 10, "read no process list on %s" % host
        for secret in [key, hub_token] + clients:
            assert secret not in cmdlines, "a secret in a process's argv on %s" % host
    # The hosts: journal, units and env files hold no key; only the two 0600 secrets files do.
    for host in INSTANCES:
        journal = on_host(host, "journalctl", "--no-pager", "-o", "cat")
        assert key not in journal and hub_token not in journal, "a secret in %s's journal" % host
        found = subprocess.run(["podman", "exec", host, "grep", "-rlF", hub_token, "/etc", "/opt/pdctl",
                                "/var/lib/pdctl", "/mnt/model"], capture_output=True, text=True)
        assert found.returncode == 1 and found.stdout == "", "Hub token on %s in %s" % (host, found.stdout)
        holders = on_host(host, "grep", "-rlF", key, "/etc", "/opt/pdctl", "/var/lib/pdctl").split()
        # The routers and the front doors (its upstream key, root's: HAProxy reads it before dropping
        # privileges) live on the decode host and the first prefill host (the second front door, issue 39).
        owners = {"/etc/pdctl/serving-secrets.env": "600 pdctl"}
        if host in ("lab-decode-0", "lab-prefill-0"):
            owners.update({"/etc/pdctl/router-secrets.env": "600 pdctl", "/etc/pdctl/frontdoor-secrets.env": "600 root"})
        assert set(holders) == set(owners), host
        for path in holders:
            assert on_host(host, "stat", "-c", "%a %U", path).strip() == owners[path], path


# ---------------------------------------------------------------- issue 13 item 4: a stop drains

# POSTs a streamed request from inside the router host (an instance's port admits only it) and relays the
# status, then every line of the answer, on stdout; the key and the body come on stdin.
RELAY = r"""
import sys, urllib.error, urllib.request
key, body = sys.stdin.readline().strip(), sys.stdin.read()
req = urllib.request.Request(sys.argv[1], data=body.encode(),
                             headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
try:
    with urllib.request.urlopen(req, timeout=120) as resp:
        print("STATUS %d" % resp.status, flush=True)
        for raw in resp:
            print(raw.decode().rstrip("\r\n"), flush=True)
except urllib.error.HTTPError as exc:
    print("STATUS %d" % exc.code, flush=True)
"""


def _stream_until_done(url, body, started, results, key):
    """results[key] = (status, chunks, finish_reason, [DONE], completion tokens, failure kind by pdctl.outcome)."""
    chunks, reader, status = 0, outcome.StreamReader(), None

    def feed(line):
        nonlocal chunks
        reader.feed(line)
        if line.startswith("data: ") and not reader.done:
            chunks += 1
            started.set()

    try:
        if url == FRONTDOOR:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120, verify=CA,
                              headers={"Authorization": "Bearer " + client_key()}) as resp:
                status = resp.status_code
                for line in resp.iter_lines():
                    feed(line)
        else:
            proc = subprocess.Popen(["podman", "exec", "-i", ROUTER_HOST, "python3", "-c", RELAY,
                                     url + "/v1/chat/completions"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            proc.stdin.write(api_key() + "\n" + json.dumps(body))
            proc.stdin.close()
            for line in proc.stdout:
                line = line.rstrip("\n")
                if line.startswith("STATUS ") and status is None:
                    status = int(line.split()[1])
                else:
                    feed(line)
            if proc.wait(30) != 0:
                reader.error = reader.error or proc.stderr.read()[-500:]
    except httpx.HTTPError as exc:
        reader.error = reader.error or repr(exc)
    results[key] = (status, chunks, reader.finish_reason, reader.done, reader.tokens,
                    reader.kind(status, body["max_tokens"]))


@pytest.mark.parametrize("host,instance,url", [
    ("lab-prefill-0", "prefill-0", "http://10.89.64.11:8100"),   # streams served by the prefill instance
    ("lab-decode-0", "decode-0", FRONTDOOR),                      # P/D streams, decode leg in flight
])
def test_systemctl_stop_completes_the_streams_in_flight(converged_lab, host, instance, url):
    import threading

    n = 6
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count slowly."}],
            "max_tokens": 400, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    unit = "pdctl-vllm-%s.service" % instance
    assert "KillMode=mixed" in on_host(host, "systemctl", "cat", unit)
    results, started = {}, [threading.Event() for _ in range(n)]
    threads = [threading.Thread(target=_stream_until_done, args=(url, body, started[i], results, i))
               for i in range(n)]
    for t in threads:
        t.start()
    try:
        assert all(e.wait(60) for e in started), "streams did not start"
        on_host(host, "systemctl", "stop", unit)  # returns once the unit has stopped
        for t in threads:
            t.join(120)
        assert len(results) == n
        for key, (status, chunks, finish, done, tokens, kind) in sorted(results.items()):
            assert status == 200 and done and finish == "length" and kind is None, \
                "%s: stream %d cut by the stop: %r" % (instance, key, results[key])
    finally:
        on_host(host, "systemctl", "start", unit)
        deadline = time.time() + 180
        while time.time() < deadline:
            if get_on_host(ROUTER_HOST, url.replace(FRONTDOOR, DECODE) + "/health")[0] == 200:
                break
            time.sleep(2)
