#!/usr/bin/env python3
"""A rolling upgrade under load on the lab, measured: one JSON line at the end.

    .venv/bin/python benchmarks/upgrade.py --scenario flag

8 streaming clients (every request's outcome recorded) run through the front door for the whole
upgrade, while a sampler reads, every second, which routers the front door sends to and how many
healthy prefill instances those routers have (min_prefill_capacity). cross_release_pairs is the lab
decode's count of KV pulls refused across releases, over the run.

Scenarios:
  flag-interrupted
           flag, with the playbook killed (SIGKILL to its process group) 8, 30 and 45 s into three runs,
           each re-run; upgrade_s counts every run.
  flag     a flag of the prefill pool changes (--shutdown-timeout 300 -> 240): playbooks/upgrade.yml rolls
           the four prefill instances one at a time; then a second run (nothing to do) and a third that
           restores the inventory's flag, under the same load.
  release  the stand-in release B as the target (pdctl_lab_engine_release, vllm_version lab-0.2.0): the
           two-pool switch, then a second run (nothing to do), then back to the inventory's release A (the
           same switch), all under the same load. cross_release_pairs counts the decode's refused pulls,
           temporary_decode_cross_release_pairs the temporary decode's.
  bad-sla, bad-accuracy
           B with a fault as the target: the gates after the switch fail. Automatic rollback is not built
           yet (docs/upgrades.md): the line records the failed run; the lab is then returned to A.

The lab must be up and converged (`scripts/lab`). Prints progress on stderr, the JSON line on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

from pdctl import collection
from pdctl.lab.load import FrontdoorCapacity, StreamLoad

ROOT = collection.root()
INVENTORY = ROOT / "inventories" / "lab"
FRONTDOOR_HOST = "lab-decode-0"
FRONTDOOR = "https://10.89.64.13:8443"
DECODE_METRICS = "http://10.89.64.13:8100/metrics"
CA = str(ROOT / ".lab" / "tls" / "ca.pem")
RELEASE_SCENARIOS = {"release": "B", "bad-sla": "bad-sla", "bad-accuracy": "bad-accuracy"}
RELEASES = yaml.safe_load((INVENTORY / "group_vars/all/host_requirements.yml").read_text())["pdctl_lab_engine_releases"]

class TemporaryDecodePairs(threading.Thread):
    """The temporary decode of a release switch runs on the staging host's second prefill instance's
    port; its own cross-release count, read every second while it runs (its counter dies with it)."""

    URL = "http://10.89.64.11:8101/metrics"

    def __init__(self):
        super().__init__(daemon=True)
        self.pairs, self._seen = 0, {}
        self._halt = threading.Event()

    def run(self):
        while not self._halt.is_set():
            try:
                text = httpx.get(self.URL, timeout=3).text
                if "kv_consumer" in text or "pdctl_lab_cross_release_pairs_total" in text:
                    pid = re.findall(r'^process_start_time_seconds (\S+)$', text, re.M)
                    count = sum(float(v) for v in re.findall(
                        r"^pdctl_lab_cross_release_pairs_total(?:\{[^}]*\})? (\S+)$", text, re.M))
                    self._seen[pid[0] if pid else "?"] = count
                    self.pairs = int(sum(self._seen.values()))
            except httpx.HTTPError:
                pass
            self._halt.wait(1.0)

    def stop(self):
        self._halt.set()
        self.join(10)


def log(msg):
    print("[upgrade bench %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def cross_release_pairs():
    text = httpx.get(DECODE_METRICS, timeout=10).text
    return sum(float(v) for v in re.findall(r"^pdctl_lab_cross_release_pairs_total(?:\{[^}]*\})? (\S+)$", text, re.M))


def client_key():
    """The lab's `tester` client (.lab/secrets/clients.yml, made by `pdctl lab up`)."""
    clients = yaml.safe_load((ROOT / ".lab" / "secrets" / "clients.yml").read_text())
    return {c["name"]: c["key"] for c in clients}["tester"]


def run_upgrade(extra_vars, label, kill_after=None):
    """ansible-playbook playbooks/upgrade.yml on the lab; (rc, seconds, hosts with changes, tail).
    kill_after: SIGKILL the playbook's whole process group that many seconds in (an operator's kill -9)."""
    cmd = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "playbooks/upgrade.yml", "-i", str(INVENTORY)]
    if extra_vars:
        cmd += ["-e", "@" + str(extra_vars)]
    log("%s: %s" % (label, " ".join(cmd[1:])))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=kill_after)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        last = [ln for ln in stdout.splitlines() if ln.startswith("TASK [")][-1:]
        log("%s: killed after %.0f s, in %s" % (label, time.monotonic() - t0, last[0] if last else "?"))
    took = time.monotonic() - t0
    changed = {h: int(c) for h, c in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", stdout, re.M)}
    log("%s: exit %d in %.1f s, changed %s" % (label, proc.returncode, took, changed))
    tail = [ln for ln in stdout.splitlines() if '"msg"' in ln or "FAILED" in ln or "fatal" in ln][-5:]
    return proc.returncode, took, changed, tail


def flag_vars(tmp):
    serving = yaml.safe_load((INVENTORY / "group_vars" / "all" / "serving.yml").read_text())
    args = serving["pdctl_serve_args"]
    prefill = list(args["prefill"])
    i = prefill.index("--shutdown-timeout")
    prefill[i + 1] = "240" if prefill[i + 1] != "240" else "300"
    path = Path(tmp) / "flag.yml"
    path.write_text(yaml.safe_dump({"pdctl_serve_args": dict(args, prefill=prefill)}))
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=["flag", "flag-interrupted"] + sorted(RELEASE_SCENARIOS), default="flag")
    ap.add_argument("--clients", type=int, default=8)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pdctl-upgrade-bench-")
    result = {"scenario": args.scenario, "requests": 0, "failed_requests": 0, "cross_release_pairs": 0,
              "min_prefill_capacity": None, "prefill_total": 4, "upgrade_s": None, "rollback_s": None,
              "verdict": None}
    rc, _, _, tail = run_upgrade(None, "precondition: the lab runs what the inventory says (no load yet)")
    if rc:
        sys.exit("the lab does not converge to its inventory: %s" % " | ".join(tail))
    pairs_before = cross_release_pairs()
    sampler = FrontdoorCapacity(FRONTDOOR_HOST)
    sampler.start()
    with StreamLoad(FRONTDOOR, client_key(), clients=args.clients, verify=CA) as load:
        time.sleep(3)
        if args.scenario in ("flag", "flag-interrupted"):
            took_killed = 0.0
            if args.scenario == "flag-interrupted":
                # Killed three times at different points (staging, the first instance's switch, a later
                # instance), each time re-run; the last run completes.
                for after in (8, 30, 45):
                    _, t, _, _ = run_upgrade(flag_vars(tmp), "upgrade killed at %d s" % after, kill_after=after)
                    took_killed += t
            rc, took, changed, tail = run_upgrade(flag_vars(tmp), "upgrade (prefill flag)")
            result["upgrade_s"] = round(took + took_killed, 1)
            rc2, took2, changed2, _ = run_upgrade(flag_vars(tmp), "second run (same target)")
            result.update(second_run_s=round(took2, 1), second_run_changed=sum(changed2.values()))
            rc3, took3, _, tail3 = run_upgrade(None, "restore (the inventory's flag)")
            result["restore_s"] = round(took3, 1)
            problems = []
            if rc or rc2 or rc3:
                problems.append("playbook exit %d/%d/%d: %s" % (rc, rc2, rc3, " | ".join(tail + tail3)[:400]))
            if changed2 and sum(changed2.values()):
                problems.append("the second run changed %s" % changed2)
        else:
            release = RELEASE_SCENARIOS[args.scenario]
            path = Path(tmp) / "release.yml"
            path.write_text(yaml.safe_dump({"pdctl_lab_engine_release": release,
                                            "vllm_version": "lab-" + RELEASES[release]}))
            watcher = TemporaryDecodePairs()
            watcher.start()
            rc, took, changed, tail = run_upgrade(path, "upgrade (release %s)" % release)
            result["upgrade_s"] = round(took, 1)
            rc2, took2, changed2, _ = run_upgrade(path, "second run (same target)")
            result.update(second_run_s=round(took2, 1), second_run_changed=sum(changed2.values()))
            rc3, took3, _, tail3 = run_upgrade(None, "back to the inventory's release")
            result["restore_s"] = round(took3, 1)
            watcher.stop()
            result["temporary_decode_cross_release_pairs"] = watcher.pairs
            problems = []
            if rc or rc2 or rc3:
                problems.append("playbook exit %d/%d/%d: %s" % (rc, rc2, rc3, " | ".join(tail + tail3)[:400]))
            if sum(changed2.values()):
                problems.append("the second run changed %s" % changed2)
            if watcher.pairs:
                problems.append("%d KV pulls across releases at the temporary decode" % watcher.pairs)
        time.sleep(3)
    sampler.stop()
    summary = load.summary()
    result.update(requests=summary["requests"], failed_requests=summary["failed_requests"],
                  cross_release_pairs=int(cross_release_pairs() - pairs_before),
                  min_prefill_capacity=sampler.minimum(), capacity_samples=len(sampler.samples))
    if summary["failed_requests"]:
        problems.append("%d failed requests: %s" % (summary["failed_requests"], summary["errors"]))
    # A compatible change keeps N-1 of N prefill instances serving; a release switch serves throughout,
    # from the new release's first pair (one prefill instance) while the old pool drains.
    floor = result["prefill_total"] - 1 if args.scenario.startswith("flag") else 1
    if result["min_prefill_capacity"] is None or result["min_prefill_capacity"] < floor:
        problems.append("prefill capacity fell to %s of %d (floor %d)" % (result["min_prefill_capacity"],
                                                                         result["prefill_total"], floor))
    if result["cross_release_pairs"]:
        problems.append("%d KV pulls across releases" % result["cross_release_pairs"])
    result["verdict"] = "pass" if not problems else "fail: " + "; ".join(problems)
    print(json.dumps(result))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
