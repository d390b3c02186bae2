#!/usr/bin/env python3
"""A rolling upgrade under load on the lab, measured: one JSON line at the end.

    .venv/bin/python benchmarks/upgrade.py --scenario flag

8 streaming clients (every request's outcome recorded and judged by pdctl.outcome's rule: HTTP 200,
[DONE], finish_reason stop/length, the token count asked for; failed_by_kind counts status / cut / abort /
short) run through the front door for the whole
upgrade, while a sampler reads, every second, which routers the front door sends to and how many
healthy prefill instances those routers have (min_prefill_capacity). cross_release_pairs is the lab
decode's count of KV pulls refused across releases, over the run.

Scenarios:
  flag-interrupted
           flag, with the playbook killed (SIGKILL to its process group) 8, 30 and 45 s into three runs,
           each re-run; upgrade_s counts every run.
  flag-bad-sla
           a change of the prefill instances' configuration that breaks the SLA: their environment points the
           engine stand-in at a profile with prefill 200x slower (PDCTL_ENGINE_PROFILE; a 4K prompt's TTFT ~4 s,
           the lab's gate 2.5 s). The stand-in's latency knobs are its profile's, so in the lab the bad change is
           an environment change; a flag rolls the same way. playbooks/upgrade.yml rolls the four prefill
           instances, the gates fail, it rolls them back to the configuration each host recorded before the
           change, runs the gates again and exits non-zero naming the gate; a second run with the same target is
           refused; then the inventory's configuration, nothing to do.
  decode-flag
           a flag of the decode instance changes (--shutdown-timeout 300 -> 240): playbooks/upgrade.yml stops the
           last prefill instance and starts a temporary decode on its GPUs, the routers pair the other three with
           it, the decode restarts on its new unit, then everything goes back (roles/upgrade decode); a second run
           (nothing to do) and a third that restores the inventory's flag, under the same load.
  decode-flag-interrupted
           decode-flag, with the playbook killed (SIGKILL to its process group) three times, each in a run that
           resumes the one before from the decode host's turn record: while the temporary decode starts, while
           the decode restarts on its new unit, while the lender starts again; the fourth run completes.
  flag     a flag of the prefill pool changes (--shutdown-timeout 300 -> 240): playbooks/upgrade.yml rolls
           the four prefill instances in batches (pdctl_rollout_prefill_keep, or --prefill-keep: 0.5 two at a
           time, 1 one at a time; the capacity floor follows it); then a second run (nothing to do) and a third
           that restores the inventory's flag, under the same load.
  release  the stand-in release B as the target (pdctl_lab_engine_release, vllm_version lab-0.2.0): the
           two-pool switch, then a second run (nothing to do), then back to the inventory's release A (the
           same switch), all under the same load. cross_release_pairs counts the decode's refused pulls,
           temporary_decode_cross_release_pairs the temporary decode's.
  bad-sla, bad-accuracy
           B with a fault as the target: the gates after the switch fail and the playbook rolls every
           instance back to A by itself (the same switch), runs the gates again and exits non-zero naming
           the gate; rollback_s is that rollback. A second run with the same target is refused (it was
           rolled back); then the inventory's release, nothing to do.
  release-interrupted
           bad-sla, with the playbook killed four times (KILL_POINTS: during staging, during the switch,
           late in the switch, during the rollback), each time run again; the last run completes the
           rollback. `kills` says where each kill landed (the task the killed run was in). --kills picks
           some of them: `--kills switch` is the short version CI runs (tests/integration/test_upgrade_lab.py).
  driver   host maintenance (playbooks/maintenance.yml): the manifest's driver release (driver, fabric
           manager, nscq) changed to the lab's rehearsal release (pdctl_lab_driver_rehearsal_versions) on
           the three hosts, one at a time (the prefill hosts reboot, the decode host, which also runs the
           router and the front door, reloads its module); then a second run (nothing to do), then back to
           the manifest's release. hosts_s is each host's turn (artifacts/maintenance/last.json).
  kernel   a kernel update on every host (/run/reboot-required, as Debian's and Ubuntu's kernel packages write it):
           playbooks/maintenance.yml reboots each host in turn, the decode host included (it also runs a router and
           the front door holding the virtual address: the address moves to the other front door first, whose
           routers serve; streams open on the moving front door end with it). The clients use the virtual address.
           hosts_s is each host's turn, order the turns' order; rebooted says which hosts came back from a reboot
           (PID 1 is new); failed_at_vip_move counts the failures of requests in flight when the run began to move
           the address (they are excused, at most one per client and move; any other failure is not), failed_detail
           each failure's start and end in seconds from the nearest move. The capacity is read on the front door
           that holds the address.
  driver-link-down
           driver, with lab-prefill-1's emulated GPUs coming back from the new release with an NVLink down
           (faults_by_driver in its hardware profile): lab-prefill-0 upgrades, lab-prefill-1 fails its
           checks and stays out of service, the run stops there naming it, lab-decode-0 is not touched;
           then back to the manifest's release everywhere.

--load-fraction F: F x the front door's in-flight limit streaming clients instead of --clients (0.8: 80% of
admission; clients hold a request in flight all the time). by_capacity groups every request by the prefill
capacity the front door's routers had when it started (4, 3, ... of 4 healthy): requests, failed, status_503,
mean and p90 TTFT of the ok ones, so the cost of each phase of a switch shows.

--ready-after S: every engine takes S seconds to load after each start (production-like: a GLM-5.2 instance
loads ~460 GB and captures CUDA graphs for minutes; the stand-in's faults.slow_start_s, pdctl.lab.slow_start).
The instances are put on that profile before the scenario (no load yet) and back on the lab's after it;
ready_after_s and setup_s (that first restart) are in the line, and the timing model's engine_ready_s includes S.

estimate_s is the rollout plan's estimate of the scenario's upgrade run (plugins/module_utils/rollout_plan.py with
the lab's timing model, inventories/lab/group_vars/all/rollout.yml; flag, release and driver), estimate_error
its relative error against upgrade_s.

The lab must be up and converged (`scripts/lab`). Prints progress on stderr, the JSON line on stdout.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

from pdctl import collection, inventory
from pdctl.lab import hardware, slow_start, stage, strays
from pdctl.lab.load import FrontdoorCapacity, StreamLoad, vip_holder

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import admission, rollout_plan

ROOT = collection.root()
INVENTORY = ROOT / "inventories" / "lab"
FRONTDOOR_HOST = "lab-decode-0"
FRONTDOOR = "https://10.89.64.13:8443"
DECODE_METRICS = "http://10.89.64.13:8100/metrics"
# A release switch's temporary decode runs on the staging host's second prefill instance's port; a decode
# change's (and the decode host's turn's) on the last prefill instance's, prefill-3.
TEMPORARY_DECODE_METRICS = "http://10.89.64.11:8101/metrics"
LENDER_DECODE_METRICS = "http://10.89.64.12:8101/metrics"
CA = str(ROOT / ".lab" / "tls" / "ca.pem")
RELEASE_SCENARIOS = {"release": "B", "bad-sla": "bad-sla", "bad-accuracy": "bad-accuracy",
                     "release-interrupted": "bad-sla"}
DRIVER_SCENARIOS = ["driver", "driver-link-down", "kernel"]
SCENARIOS = (["flag", "flag-interrupted", "flag-bad-sla", "decode-flag", "decode-flag-interrupted"]
             + sorted(RELEASE_SCENARIOS) + DRIVER_SCENARIOS)
# decode-flag-interrupted: where each run is killed (a task header of that run's output, then seconds). A resumed
# run goes through the temporary decode's steps again (each a no-op where done), so each point is in the next
# phase: the way in, the decode's restart, the way out.
# A task of a role prints as "TASK [pdctl.vllm_pd.<role> : <name>]": ROLE_PREFIX takes it or none.
ROLE_PREFIX = r"(?:[\w.]+ : )?"
DECODE_KILLS = [("while the temporary decode starts", [r"^TASK \[.*The temporary decode runs\]"], 0.3),
                ("while the decode restarts", [r"^TASK \[%sInstance runs its unit: decode-0\]" % ROLE_PREFIX], 0.3),
                ("while the lender starts again", [r"^TASK \[%sInstance runs its unit: prefill-3\]" % ROLE_PREFIX], 0.3)]
# flag-bad-sla: the prefill instances' engine profile, with prefill 200x slower than the lab's.
SLOW_PREFILL_PROFILE = "/etc/pdctl/engine/profile-slow-prefill.yml"
# The host whose GPUs come back from the new driver with a link down (driver-link-down).
LINK_DOWN_HOST = "lab-prefill-1"
LAB_HOSTS = ["lab-prefill-0", "lab-prefill-1", "lab-decode-0"]
# release-interrupted: where the kills land (a line of the playbook's output, then seconds), by name; --kills
# picks some (CI's short run: `switch` only).
KILL_POINTS = {
    # (a task every run prints: with display_skipped_hosts false a skipped task prints no line)
    "staging": ("during staging", ([r"^TASK \[.*Read the lock the release venv was installed from"], 1)),
    "switch": ("during the switch", ([r"^TASK \[%sThe router pairs only the new release" % ROLE_PREFIX], 3)),
    "late": ("late in the switch", ([r"^TASK \[.*The temporary decode is stopped"], 0.5)),
    "rollback": ("during the rollback", ([r"^TASK \[%sRelease switch record: rolling-back\]" % ROLE_PREFIX,
                                          r"^TASK \[%sThe router pairs only" % ROLE_PREFIX], 3)),
}
# The inventory every run uses: the lab's, or with --ready-after its slow-start copy (main sets it).
SERVING_INVENTORY = INVENTORY
# The share of the prefill instances a prefill change keeps serving (pdctl_rollout_prefill_keep): the inventory's,
# or --prefill-keep's (main sets it; the flag scenarios pass it to every run).
PREFILL_KEEP = None
RELEASES = yaml.safe_load((INVENTORY / "group_vars/all/host_requirements.yml").read_text())["pdctl_lab_engine_releases"]

# The instances' API ports admit the router hosts only (vLLM's POST /invocations generates without a key):
# their /metrics are read from the router host.
METRICS_GET = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).read().decode())"


def instance_metrics(url, timeout):
    """The text of an instance's /metrics URL, read on the router host (FRONTDOOR_HOST runs the router)."""
    try:
        res = subprocess.run(["podman", "exec", FRONTDOOR_HOST, "python3", "-c", METRICS_GET, url, str(timeout)],
                             capture_output=True, text=True, timeout=timeout + 20)
    except subprocess.TimeoutExpired as exc:
        raise httpx.TransportError("%s: no answer in %s s" % (url, timeout)) from exc
    if res.returncode != 0:
        raise httpx.TransportError("%s: %s" % (url, res.stderr.strip()[-200:]))
    return res.stdout


# What DecodeCounter counts: KV pulls refused across releases; KV pulls that failed (a handshake's timeout included).
CROSS_RELEASE_PAIRS, FAILED_PULLS = "pdctl_lab_cross_release_pairs_total", "vllm:nixl_num_failed_transfers_total"


class DecodeCounter(threading.Thread):
    """Counters (`metrics`) of the decode processes at `url` (the lab's decode, or a temporary decode on a
    prefill instance's port; a process that is not a KV consumer is not counted), one read a second: a counter
    lives as long as the process, and an upgrade restarts the decode (and starts and stops the temporary one),
    so each process's count is kept apart, from what it had counted when the benchmark first saw it.
    `counts`: {metric: the increase since the benchmark started}."""

    def __init__(self, url, metrics):
        super().__init__(daemon=True)
        self.url, self.counts, self._seen, self._base = url, dict.fromkeys(metrics, 0), {}, {}
        self._patterns = {m: re.compile(r"^%s(?:\{[^}]*\})? (\S+)$" % re.escape(m), re.M) for m in metrics}
        self._halt = threading.Event()

    def run(self):
        first = True
        while not self._halt.is_set():
            try:
                text = instance_metrics(self.url, 3)
                if "kv_consumer" in text or CROSS_RELEASE_PAIRS in text:
                    pid = (re.findall(r"^pdctl_lab_engine_start_time_seconds (\S+)$", text, re.M) or ["?"])[0]
                    for metric, pattern in self._patterns.items():
                        count = sum(float(v) for v in pattern.findall(text))
                        if first:
                            self._base[pid, metric] = count
                        self._seen[pid, metric] = count
                        self.counts[metric] = int(sum(c - self._base.get(k, 0) for k, c in self._seen.items()
                                                      if k[1] == metric))
            except httpx.HTTPError:
                pass
            first = False
            self._halt.wait(1.0)

    def stop(self):
        self._halt.set()
        self.join(10)


def log(msg):
    print("[upgrade bench %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def client_key():
    """The lab's `tester` client (made by `pdctl-lab up`)."""
    return stage.client_key(ROOT / ".lab")


def run_upgrade(extra_vars, label, kill_after=None, kill_at=None, playbook_args=(), playbook="playbooks/upgrade.yml",
                inventory_dir=None):
    """ansible-playbook playbooks/upgrade.yml on the lab; a Run (rc, seconds, hosts with changes, tail,
    rollback_s). Killed like an operator's kill -9 (SIGKILL to the playbook's whole process group):
    kill_after seconds in, or kill_at = ([regex, ...], seconds): that many seconds after lines matching
    each regex in turn have been printed."""
    cmd = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), playbook, "-i", str(inventory_dir or SERVING_INVENTORY)]
    if extra_vars:
        cmd += ["-e", "@" + str(extra_vars)]
    cmd += list(playbook_args)
    log("%s: %s" % (label, " ".join(cmd[1:])))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines, marks, deadline = [], {}, (t0 + kill_after) if kill_after else None
    reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines, marks), daemon=True)
    reader.start()
    killed, seen, waiting_for = None, 0, list(kill_at[0]) if kill_at else []
    while proc.poll() is None:
        now = time.monotonic()
        while waiting_for and seen < len(lines):
            if re.search(waiting_for[0], lines[seen]):
                waiting_for.pop(0)
                if not waiting_for:
                    deadline = now + kill_at[1]
            seen += 1
        if deadline is not None and now >= deadline:
            below = strays.descendants(proc.pid)
            os.killpg(proc.pid, signal.SIGKILL)
            killed = [ln for ln in lines if ln.startswith("TASK [")][-1:]
            break
        time.sleep(0.2)
    proc.wait()
    if killed is not None:
        ended = strays.end(below)  # what outlived the group (Mitogen's multiplexers), once the run is dead
        if ended:
            log("%s: ended %d process(es) the killed run left in sessions of their own" % (label, len(ended)))
    reader.join(10)
    took = time.monotonic() - t0
    stdout = "\n".join(lines)
    log_file = Path(tempfile.mkstemp(prefix="pdctl-upgrade-run-", suffix=".log")[1])
    log_file.write_text(stdout + "\n")
    if killed is not None:
        log("%s: killed after %.0f s, in %s" % (label, took, killed[0] if killed else "?"))
    changed = {h: int(c) for h, c in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", stdout, re.M)}
    log("%s: exit %d in %.1f s, changed %s; output in %s" % (label, proc.returncode, took, changed, log_file))
    tail = [ln for ln in lines if '"msg"' in ln or "FAILED" in ln or "fatal" in ln][-5:]
    rollback_s = round(marks["end"] - marks["rollback"], 1) if "rollback" in marks else None
    return Run(proc.returncode, took, changed, tail, rollback_s, stdout, killed[0] if killed else None,
               marks.get("vip_moves", []))


# What run_upgrade saw; rollback_s runs from the moment the rollback is recorded to the end of the playbook;
# killed_in is the last task the run printed before it was killed (None: not killed).
# vip_moves: when the run began to move the front door's virtual address away from a host (monotonic), each time.
Run = collections.namedtuple("Run", "rc took changed tail rollback_s stdout killed_in vip_moves")
KEEPALIVED_STOP = re.compile(r"^TASK \[%sKeepalived stops here" % ROLE_PREFIX)
ROLLBACK_RECORDED = re.compile(r"^TASK \[%s(?:Release switch|Prefill change) record: rolling-back\]" % ROLE_PREFIX)


def _read_lines(stream, lines, marks):
    for line in stream:
        lines.append(line.rstrip("\n"))
        # The rollback starts where it is recorded, or, resumed, where the run says it rolls back.
        # A front-door host's keepalived stops (changed: it ran; a host that is no front door skips the task).
        if line.startswith("TASK ["):
            marks["keepalived_stop"] = time.monotonic() if KEEPALIVED_STOP.match(line) else None
        elif line.startswith("changed:") and marks.get("keepalived_stop"):
            marks.setdefault("vip_moves", []).append(marks.pop("keepalived_stop"))
        if "rollback" not in marks and (ROLLBACK_RECORDED.match(line) or "rolling back: the two-pool switch" in line):
            marks["rollback"] = time.monotonic()
    marks["end"] = time.monotonic()


def instance_releases():
    """{instance: the stand-in release it runs} (the release label of pdctl_lab_engine_info), read from
    every planned instance; None for one that does not answer."""
    out = {}
    for inst in inventory.plan(INVENTORY)["instances"]:
        try:
            text = instance_metrics(inst["url"] + "/metrics", 10)
            found = re.findall(r'^pdctl_lab_engine_info\{[^}]*release="([^"]*)"', text, re.M)
            out[inst["name"]] = found[0] if found else None
        except httpx.HTTPError:
            out[inst["name"]] = None
    return out


def estimate(scenario):
    """The timing model's estimate (the serving inventory's pdctl_rollout_timing, rollout_plan) of the scenario's
    upgrade run, from the lab's plan; None for the scenarios it does not model (killed runs, rollbacks)."""
    timing = {}
    for name in ("rollout.yml", "zz-slow-start.yml"):  # (the second: --ready-after's copy)
        path = SERVING_INVENTORY / "group_vars" / "all" / name
        if path.exists():
            timing.update((yaml.safe_load(path.read_text()) or {}).get("pdctl_rollout_timing") or {})
    plan = inventory.plan(INVENTORY)
    if scenario == "flag":
        steps = rollout_plan.prefill_steps(plan, timing, gated=True, keep=PREFILL_KEEP)
    elif scenario == "decode-flag":
        decode = [i["name"] for i in plan["instances"] if i["pool"] == "decode"]
        steps = rollout_plan.prefill_steps(plan, timing, pending=decode, gated=True)
    elif scenario == "release":
        steps = rollout_plan.release_steps(plan, timing)
    elif scenario == "driver":
        steps = rollout_plan.maintenance_steps(plan, timing, reload_hosts=[FRONTDOOR_HOST])
    elif scenario == "kernel":
        steps = rollout_plan.maintenance_steps(plan, timing, reload_hosts=[])
    else:
        return None
    return rollout_plan.summary(steps)["seconds"]


def flag_vars(tmp, pool="prefill"):
    """Extra vars that change one flag of the pool's instances (--shutdown-timeout 300 -> 240)."""
    # The inventory's value, else the defaults layer's (where the recipe's flags live).
    args = next(iter(inventory.load(INVENTORY, names=["pdctl_serve_args"]).values()))["vars"]["pdctl_serve_args"]
    flags = list(args[pool])
    i = flags.index("--shutdown-timeout")
    flags[i + 1] = "240" if flags[i + 1] != "240" else "300"
    path = Path(tmp) / ("flag-%s.yml" % pool)
    path.write_text(yaml.safe_dump({"pdctl_serve_args": dict(args, **{pool: flags}),
                                    "pdctl_rollout_prefill_keep": PREFILL_KEEP}))
    return path


def main():
    global SERVING_INVENTORY, PREFILL_KEEP
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=SCENARIOS, default="flag")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--load-fraction", type=float, default=0, metavar="F",
                    help="F x the front door's in-flight limit clients (e.g. 0.8), instead of --clients")
    ap.add_argument("--kills", default=",".join(KILL_POINTS),
                    help="release-interrupted: where the playbook is killed, of %s" % ", ".join(KILL_POINTS))
    ap.add_argument("--ready-after", type=float, default=0, metavar="S",
                    help="every engine loads for S seconds after each start (production-like: minutes)")
    ap.add_argument("--prefill-keep", type=float, metavar="SHARE",
                    help="flag scenarios: pdctl_rollout_prefill_keep for the run (default: the inventory's; 1 rolls "
                         "one instance at a time)")
    args = ap.parse_args()
    PREFILL_KEEP = args.prefill_keep if args.prefill_keep is not None else next(iter(inventory.load(
        INVENTORY, names=["pdctl_rollout_prefill_keep"]).values()))["vars"]["pdctl_rollout_prefill_keep"]
    kills = [k for k in args.kills.split(",") if k]
    if any(k not in KILL_POINTS for k in kills):
        ap.error("--kills: %s is not one of %s" % (args.kills, ", ".join(KILL_POINTS)))
    if args.ready_after and args.scenario == "flag-bad-sla":
        ap.error("--ready-after: flag-bad-sla changes the engine profile itself; pick another scenario")
    if args.load_fraction:
        args.clients = max(1, round(args.load_fraction * admission_limit()))
    tmp = tempfile.mkdtemp(prefix="pdctl-upgrade-bench-")
    result = {"scenario": args.scenario, "clients": args.clients, "requests": 0, "failed_requests": 0, "cross_release_pairs": 0,
              "min_prefill_capacity": None, "prefill_total": 4, "upgrade_s": None, "rollback_s": None,
              "verdict": None}
    driver = args.scenario in DRIVER_SCENARIOS
    if args.ready_after:
        t0 = time.monotonic()
        SERVING_INVENTORY = slow_start.apply(Path(tmp) / "inventory-slow-start", args.ready_after, log)
        result.update(ready_after_s=args.ready_after, setup_s=round(time.monotonic() - t0, 1))
    try:
        return measure(args, kills, tmp, result, driver)
    finally:
        if args.ready_after:
            t0 = time.monotonic()
            slow_start.restore(LAB_HOSTS, log)
            log("teardown: %.0f s" % (time.monotonic() - t0))


def measure(args, kills, tmp, result, driver):
    """The scenario under load; prints the JSON line, returns the exit code."""
    pre = run_upgrade(None, "precondition: the lab runs what the inventory says (no load yet)",
                      playbook=MAINTENANCE if driver else "playbooks/upgrade.yml")
    if pre.rc:
        sys.exit("the lab does not converge to its inventory: %s" % " | ".join(pre.tail))
    before = instance_releases()
    problems = []
    # The kernel scenario reboots each front door in turn: the capacity is read where the virtual address is.
    vip = inventory.plan(SERVING_INVENTORY)["frontdoor"].get("vip") if args.scenario == "kernel" else None
    sampler = FrontdoorCapacity(FRONTDOOR_HOST, vip=vip["address"] if vip else None,
                                hosts=inventory.plan(SERVING_INVENTORY)["frontdoor"]["hosts"])
    sampler.start()
    # One reader per port: the decode, the release switch's temporary decode, a decode change's.
    decode_pairs = DecodeCounter(DECODE_METRICS, (CROSS_RELEASE_PAIRS, FAILED_PULLS))
    watcher = DecodeCounter(TEMPORARY_DECODE_METRICS, (CROSS_RELEASE_PAIRS, FAILED_PULLS))
    counters = [decode_pairs, watcher, DecodeCounter(LENDER_DECODE_METRICS, (FAILED_PULLS,))]
    for counter in counters:
        counter.start()
    time.sleep(2)  # each sampler's first reading is its baseline
    # The kernel scenario reboots the host behind FRONTDOOR: its clients use the virtual address, as real ones do.
    url = inventory.plan(SERVING_INVENTORY)["frontdoor"]["url"] if args.scenario == "kernel" else FRONTDOOR
    # A stream open on a front door the address moves away from hears nothing more: clients give up after 30 s of
    # silence there (as faults.py's host loss does) rather than the default.
    timeout = {"timeout": 30} if args.scenario == "kernel" else {}
    with StreamLoad(url, client_key(), clients=args.clients, verify=CA, **timeout) as load:
        time.sleep(3)
        if args.scenario in ("flag", "flag-interrupted", "decode-flag", "decode-flag-interrupted"):
            problems += flag_scenario(args.scenario, tmp, result)
        elif args.scenario == "flag-bad-sla":
            problems += flag_bad_sla_scenario(tmp, result)
        elif args.scenario == "kernel":
            problems += kernel_scenario(result, load)
        elif driver:
            problems += driver_scenario(args.scenario, tmp, result)
        else:
            problems += release_scenario(args.scenario, tmp, result, before, kills)
        time.sleep(3)
    sampler.stop()
    for counter in counters:
        counter.stop()
    summary = load.summary()
    if args.scenario == "kernel":
        result.update(vip_failures(result.pop("vip_moves", []), load.failed()))
        restore_vip(result)
    result.update(requests=summary["requests"], failed_requests=summary["failed_requests"],
                  failed_by_kind=summary["failed_by_kind"],
                  cross_release_pairs=decode_pairs.counts[CROSS_RELEASE_PAIRS],
                  kv_pull_failures=sum(c.counts[FAILED_PULLS] for c in counters),
                  min_prefill_capacity=sampler.minimum(), capacity_samples=len(sampler.samples),
                  by_capacity=by_capacity(load.outcomes, sampler.samples),
                  temporary_decode_cross_release_pairs=watcher.counts[CROSS_RELEASE_PAIRS])
    # A kernel update's turn of the host holding the virtual address ends the streams open on its front door (at
    # most one per client); any other failure is a fault.
    excused = (min(result.get("failed_at_vip_move") or 0, args.clients * result.get("vip_moves", 0))
               if args.scenario == "kernel" else 0)
    if summary["failed_requests"] > excused:
        problems.append("%d failed requests (%d at the address's move): %s"
                        % (summary["failed_requests"], excused, summary["errors"]))
    problems += end_state_problems(sampler)
    # A prefill change keeps pdctl_rollout_prefill_keep of the prefill instances serving (a batch out at a time);
    # a release switch serves throughout, from the new release's first pair (one prefill instance) while the old
    # pool drains. A host's maintenance takes its two prefill instances out (the decode host's, one: the lender).
    # A decode's change lends one prefill instance's GPUs to the temporary decode.
    total = result["prefill_total"]
    floor = (total - 1 if args.scenario.startswith("decode-flag")
             else total - rollout_plan.batch_size(total, PREFILL_KEEP) if "flag" in args.scenario else 2 if driver else 1)
    result.update(prefill_keep=PREFILL_KEEP, prefill_floor=floor)
    if result["min_prefill_capacity"] is None or result["min_prefill_capacity"] < floor:
        problems.append("prefill capacity fell to %s of %d (floor %d)" % (result["min_prefill_capacity"],
                                                                         result["prefill_total"], floor))
    pairs_at_temporary = result["temporary_decode_cross_release_pairs"]
    if result["cross_release_pairs"] or pairs_at_temporary:
        problems.append("%d KV pulls across releases (%d at the temporary decode)"
                        % (result["cross_release_pairs"] + pairs_at_temporary, pairs_at_temporary))
    # A pull that fails is recomputed (kv_load_failure_policy) after its wait: no client sees an error, but a
    # handshake that times out costs its TTFT seconds (a temporary decode the firewall kept from a prefill host).
    # (A release switch killed mid-switch may leave a pull across releases, counted on its own above.)
    if result["kv_pull_failures"] and args.scenario != "release-interrupted":
        problems.append("%d KV pulls failed" % result["kv_pull_failures"])
    # The plan's estimate beside the measured run (issue 41: within 25%).
    result["estimate_s"] = estimate(args.scenario)
    if result["estimate_s"] and result["upgrade_s"]:
        result["estimate_error"] = round(result["estimate_s"] / result["upgrade_s"] - 1, 3)
    result["verdict"] = "pass" if not problems else "fail: " + "; ".join(problems)
    print(json.dumps(result))
    return 0 if not problems else 1


def admission_limit():
    """The in-flight limit of the front door the clients reach, by the front door's own rule (admission.share: with a
    virtual address one front door takes every client and admits all of it)."""
    plan = inventory.plan(SERVING_INVENTORY)
    found = next(iter(inventory.load(SERVING_INVENTORY, names=("pdctl_frontdoor_max_inflight",)).values()))
    return admission.share(plan["frontdoor"], found["vars"]["pdctl_frontdoor_max_inflight"])["inflight"]


def by_capacity(outcomes, samples):
    """{healthy prefill instances: {requests, failed, status_503, mean_ttft_ms, p90_ttft_ms}}, each request under
    the capacity sampled last before it started (wall clock)."""
    times = [t for t, _ in samples]
    groups = collections.defaultdict(list)
    for o in outcomes:
        i = bisect.bisect_right(times, o.wall_start) - 1
        groups[len(samples[i][1].get("healthy", [])) if i >= 0 else None].append(o)
    out = {}
    for capacity, group in sorted(groups.items(), key=lambda kv: -1 if kv[0] is None else kv[0], reverse=True):
        ttfts = sorted(o.ttft * 1000 for o in group if o.ok and o.ttft is not None)
        out[str(capacity)] = {
            "requests": len(group), "failed": sum(not o.ok for o in group),
            "status_503": sum(o.status == 503 for o in group),
            "mean_ttft_ms": round(sum(ttfts) / len(ttfts), 1) if ttfts else None,
            "p90_ttft_ms": round(ttfts[int(0.9 * (len(ttfts) - 1))], 1) if ttfts else None}
    return out


def end_state_problems(sampler):
    """The normal state after every scenario: the front door sends to the P/D routers only (every router host's),
    which reach all four prefill instances, with each router host's aggregated router up (degraded mode's route);
    no standby router, no temporary decode left behind."""
    problems = []
    last = sampler.samples[-1][1] if sampler.samples else {}
    routers = sorted(r["host"] for r in inventory.plan(str(INVENTORY))["routers"])
    if (sorted(last.get("active", [])) != routers or len(last.get("healthy", [])) != 4
            or sorted(last.get("aggregated", [])) != [h + "-aggregated" for h in routers]):
        problems.append("front door left in %s" % last)
    # The temporary decode: a release switch's on lab-prefill-0, a decode change's or maintenance's on lab-prefill-1.
    for host, unit in ((FRONTDOOR_HOST, "pdctl-router-standby.service"),
                       ("lab-prefill-0", "pdctl-vllm-decode-temporary.service"),
                       ("lab-prefill-1", "pdctl-vllm-decode-temporary.service")):
        state = subprocess.run(["podman", "exec", host, "systemctl", "show", "-p", "LoadState", "--value", unit],
                               capture_output=True, text=True).stdout.strip()
        if state != "not-found":
            problems.append("%s left on %s (%s)" % (unit, host, state))
    # A decode change (or the decode host's maintenance turn) removes its record when it is done.
    if subprocess.run(["podman", "exec", FRONTDOOR_HOST, "test", "-e", "/var/lib/pdctl/maintenance-turn.json"]).returncode == 0:
        problems.append("the decode host's turn record is left (/var/lib/pdctl/maintenance-turn.json)")
    return problems


def flag_scenario(scenario, tmp, result):
    problems, took_killed = [], 0.0
    if scenario == "flag-interrupted":
        # Killed three times at different points (staging, the first instance's switch, a later
        # instance), each time re-run; the last run completes.
        for after in (8, 30, 45):
            took_killed += run_upgrade(flag_vars(tmp), "upgrade killed at %d s" % after, kill_after=after).took
    if scenario == "decode-flag-interrupted":
        result["killed_in"] = []
        for label, marks, after in DECODE_KILLS:
            killed = run_upgrade(flag_vars(tmp, "decode"), "upgrade killed %s" % label, kill_at=(marks, after))
            took_killed += killed.took
            result["killed_in"].append(killed.killed_in.strip(" *") if killed.killed_in else None)
            if not killed.killed_in:
                problems.append("the run was not killed %s (exit %d)" % (label, killed.rc))
    pool = "decode" if scenario.startswith("decode-flag") else "prefill"
    up = run_upgrade(flag_vars(tmp, pool), "upgrade (%s flag)" % pool)
    result["upgrade_s"] = round(up.took + took_killed, 1)
    again = run_upgrade(flag_vars(tmp, pool), "second run (same target)")
    result.update(second_run_s=round(again.took, 1), second_run_changed=sum(again.changed.values()))
    # The inventory's flag, rolled as the run's setting says (the capacity floor above holds for it too).
    back = run_upgrade(None, "restore (the inventory's flag)",
                       playbook_args=["-e", "pdctl_rollout_prefill_keep=%s" % PREFILL_KEEP])
    result["restore_s"] = round(back.took, 1)
    if up.rc or again.rc or back.rc:
        problems.append("playbook exit %d/%d/%d: %s" % (up.rc, again.rc, back.rc, " | ".join(up.tail + back.tail)[:400]))
    if sum(again.changed.values()):
        problems.append("the second run changed %s" % again.changed)
    return problems


def rolled_back_problems(up, result):
    """The run the gates rejected: it rolled back by itself, the gates passed after, it failed naming them."""
    if up.rc == 0 or "Upgrade rolled back" not in up.stdout:
        return ["not rolled back (exit %d): %s" % (up.rc, " | ".join(up.tail)[:400])]
    if "the gates after the rollback passed" not in up.stdout:
        return ["the gates failed after the rollback too"]
    result["reason"] = re.findall(r"Upgrade rolled back: ([^\n\"]{0,200})", up.stdout)[:1]
    return []


def slow_prefill_inventory(tmp):
    """A copy of the lab inventory where the prefill hosts' engine environment names a profile whose prefill is 200x
    slower (installed with the engine's files); the decode host keeps the inventory's. In the inventory, as an
    operator would change it: extra vars would outrank the configuration the rollback restores (upgrade.yml
    refuses to roll back under them)."""
    from pdctl.lab.stage import ENGINE_PROFILE
    profile = yaml.safe_load(ENGINE_PROFILE)
    profile["latency"]["prefill_tokens_per_s"] //= 200
    src = Path(tmp) / "profile-slow-prefill.yml"
    src.write_text(yaml.safe_dump(profile))
    engine = next(iter(inventory.load(INVENTORY, names=("pdctl_engine",)).values()))["vars"]["pdctl_engine"]
    slow = dict(engine, files=engine["files"] + [{"src": str(src), "dest": SLOW_PREFILL_PROFILE}],
                environment=dict(engine["environment"], PDCTL_ENGINE_PROFILE=SLOW_PREFILL_PROFILE))
    dest = Path(tmp) / "inventory-slow-prefill"
    shutil.copytree(INVENTORY, dest)
    (dest / "group_vars" / "prefill").mkdir(parents=True, exist_ok=True)
    # (JSON: the loaded values are Ansible str subclasses, which yaml.safe_dump refuses; JSON is YAML)
    (dest / "group_vars" / "prefill" / "zz-slow-prefill.yml").write_text(json.dumps({"pdctl_engine": slow}))
    # The lab's own files (.lab: keys, TLS, engine profile) for an inventory that is not in inventories/lab.
    os.environ.setdefault("PDCTL_LAB_DIR", str(ROOT / ".lab"))
    return dest


def running_configs():
    """{instance: the configuration id it started with (/run/pdctl/<name>.config)}."""
    return {inst["name"]: subprocess.run(["podman", "exec", inst["host"], "cat", "/run/pdctl/%s.config" % inst["name"]],
                                         capture_output=True, text=True).stdout.strip()
            for inst in inventory.plan(INVENTORY)["instances"]}


def flag_bad_sla_scenario(tmp, result):
    """The prefill change the gates reject: rolled back by the playbook itself; a second run with the same target
    refused; then the inventory's configuration (nothing to do)."""
    problems = []
    before = running_configs()
    bad = slow_prefill_inventory(tmp)
    up = run_upgrade(None, "upgrade (prefill instances on a slow profile)", inventory_dir=bad)
    result.update(upgrade_s=round(up.took, 1), rollback_s=up.rollback_s)
    after = running_configs()
    result["configs_restored"] = after == before
    problems += rolled_back_problems(up, result)
    if after != before:
        problems.append("instances run %s, expected %s" % (after, before))
    again = run_upgrade(None, "second run (same target)", inventory_dir=bad)
    result.update(second_run_s=round(again.took, 1), second_run_changed=sum(again.changed.values()),
                  second_run_exit=again.rc)
    if sum(again.changed.values()) or "was rolled back" not in again.stdout:
        problems.append("the second run was not refused unchanged (changed %s): %s"
                        % (again.changed, " | ".join(again.tail)[:300]))
    back = run_upgrade(None, "the inventory's configuration")
    result["restore_s"] = round(back.took, 1)
    if back.rc:
        problems.append("restore exit %d: %s" % (back.rc, " | ".join(back.tail)[:400]))
    for host in ("lab-prefill-0", "lab-prefill-1"):  # the lab as its inventory leaves it
        subprocess.run(["podman", "exec", host, "rm", "-f", SLOW_PREFILL_PROFILE], check=False)
    return problems


def release_scenario(scenario, tmp, result, before, kills=()):
    """release: A -> B, a second run, back to A. bad-sla / bad-accuracy: A -> the bad release, which the
    gates reject: the playbook rolls back to A by itself and exits non-zero naming the gate; a second
    run with the same target is refused (it was rolled back) and changes nothing. release-interrupted:
    the bad-sla upgrade killed during staging, during the switch and during the rollback, each time
    run again; the last run completes the rollback."""
    problems = []
    release = RELEASE_SCENARIOS[scenario]
    target = {"pdctl_lab_engine_release": release, "vllm_version": "lab-" + RELEASES[release]}
    path = Path(tmp) / "release.yml"
    # A release an earlier run rolled back is refused unless retried (upgrade_retry); the second run
    # below asks without it, as an operator who did not change the manifest would.
    path.write_text(yaml.safe_dump(dict(target, upgrade_retry=True)))
    again_path = Path(tmp) / "release-again.yml"
    again_path.write_text(yaml.safe_dump(target))
    took_killed = 0.0
    if scenario == "release-interrupted":
        result["kills"] = []
        for point in kills:
            label, kill_at = KILL_POINTS[point]
            run = run_upgrade(path, "upgrade killed %s" % label, kill_at=kill_at)
            took_killed += run.took
            result["kills"].append({"point": point, "killed_in": run.killed_in})
            if run.rc != -signal.SIGKILL:
                problems.append("the run meant to be killed %s ended by itself (exit %d)" % (label, run.rc))
    up = run_upgrade(path, "upgrade (release %s)" % release)
    result["upgrade_s"] = round(up.took + took_killed, 1)
    result["rollback_s"] = up.rollback_s
    after = instance_releases()
    result["releases_after"] = sorted(set(after.values()), key=str)
    if release == "B":
        expect = {name: "B" for name in after}
        if up.rc:
            problems.append("upgrade exit %d: %s" % (up.rc, " | ".join(up.tail)[:400]))
    else:
        # Rolled back: the playbook fails naming the gate, every instance is back on what it ran before.
        expect = before
        problems += rolled_back_problems(up, result)
    if after != expect:
        problems.append("instances run %s, expected %s" % (after, expect))
    again = run_upgrade(again_path, "second run (same target)")
    result.update(second_run_s=round(again.took, 1), second_run_changed=sum(again.changed.values()),
                  second_run_exit=again.rc)
    if sum(again.changed.values()):
        problems.append("the second run changed %s" % again.changed)
    if release == "B" and again.rc:
        problems.append("second run exit %d" % again.rc)
    if release != "B" and "was rolled back" not in again.stdout:
        problems.append("the second run did not refuse the rolled-back release: %s" % " | ".join(again.tail)[:300])
    back = run_upgrade(None, "back to the inventory's release")
    result["restore_s"] = round(back.took, 1)
    if back.rc:
        problems.append("restore exit %d: %s" % (back.rc, " | ".join(back.tail)[:400]))
    return problems


MAINTENANCE = "playbooks/maintenance.yml"
REPORT = ROOT / "artifacts" / "maintenance" / "last.json"


def driver_vars(tmp, version, link_down_host=None):
    """The manifest with its driver release (driver, fabric manager, nscq) at `version`; with
    link_down_host, that host's emulated GPUs report NVLink 7 of GPU 2 down under that release."""
    versions = dict(yaml.safe_load((ROOT / "inventories/b300/group_vars/all/versions.yml").read_text())["pdctl_versions"])
    versions.update(nvidia_driver=version, nvidia_fabricmanager=version, libnvidia_nscq=version)
    doc = {"pdctl_versions": versions}
    if link_down_host:
        fault = {version: {"links_down": [{"gpu": 2, "link": 7}]}}
        doc["pdctl_lab_hw_profile"] = "{{ {'faults': {}, 'faults_by_driver': %r if inventory_hostname == %r else {}} }}" % (
            fault, link_down_host)
    path = Path(tmp) / ("driver-%s%s.yml" % (version, "-link-down" if link_down_host else ""))
    path.write_text(yaml.safe_dump(doc))
    return path


def host_drivers():
    """{host: (loaded module, nvidia-smi's driver, fabric states, the driver release's package versions)}."""
    out = {}
    for host in LAB_HOSTS:
        def sh(cmd):
            return subprocess.run(["podman", "exec", host, "sh", "-c", cmd], capture_output=True, text=True).stdout.strip()
        out[host] = {
            "module": sh("cat /run/pdctl-lab/sys/module/nvidia/version"),
            "smi": sorted(set(sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader").split())),
            "fabric": sorted(set(sh("nvidia-smi --query-gpu=fabric.state --format=csv,noheader").splitlines())),
            "packages": dict(line.split() for line in sh(
                "dpkg-query -W -f '${Package} ${Version}\\n' nvidia-kernel-open-dkms nvidia-smi nvidia-fabricmanager "
                "libnvidia-nscq").splitlines() if line.strip()),
        }
    return out


def _on(drivers, host, version):
    d = drivers[host]
    return (d["module"] == version and d["smi"] == [version] and d["fabric"] == ["Completed"]
            and set(d["packages"].values()) == {version + "-1"})


def boot_marks():
    """{host: its PID 1's start time}: a new one after a reboot (the lab's containers share this machine's boot id)."""
    return {h: subprocess.run(["podman", "exec", h, "sh", "-c", "awk '{print $22}' /proc/1/stat"],
                              capture_output=True, text=True).stdout.strip() for h in LAB_HOSTS}


def vip_failures(moves, failed):
    """The failures of requests in flight when the run began to move the virtual address (each move), and every
    failure's start and end in seconds from the nearest move."""
    detail = []
    for o in failed if moves else []:
        nearest = min(moves, key=lambda m: abs(o.start - m))
        detail.append({"from_move_s": [round(o.start - nearest, 1), round(o.end - nearest, 1)],
                       "error": (o.error or "")[:80]})
    return {"vip_moves": len(moves),
            "failed_at_vip_move": sum(1 for o in failed if any(o.start <= m <= o.end for m in moves)),
            "failed_detail": detail}


def kernel_scenario(result, load):
    """Every host asks for a reboot; maintenance.yml reboots them one at a time under load; a second run has nothing
    to do."""
    problems = []
    for host in LAB_HOSTS:
        subprocess.run(["podman", "exec", host, "sh", "-c", "echo '*** System restart required ***' > /run/reboot-required"
                        " && echo linux-image-6.1.0-lab-amd64 > /run/reboot-required.pkgs"], check=True)
    before = boot_marks()
    up = run_upgrade(None, "maintenance (a kernel update on every host)", playbook=MAINTENANCE)
    result["upgrade_s"] = round(up.took, 1)
    report = json.loads(REPORT.read_text())
    result["hosts_s"] = {h: t["seconds"] for h, t in report["turns"].items()}
    result["order"] = sorted(report["turns"], key=lambda h: float(report["turns"][h].get("started", 0)))
    after = boot_marks()
    result["rebooted"] = sorted(h for h in LAB_HOSTS if after[h] != before[h])
    result["vip_moves"] = up.vip_moves  # monotonic; judged once the load has ended (vip_failures)
    if up.rc:
        problems.append("maintenance exit %d: %s" % (up.rc, " | ".join(up.tail)[:400]))
    if result["rebooted"] != sorted(LAB_HOSTS) or sorted(result["hosts_s"]) != sorted(LAB_HOSTS):
        problems.append("rebooted %s, turns %s: expected every host" % (result["rebooted"], sorted(result["hosts_s"])))
    if result["order"][-1:] != [FRONTDOOR_HOST]:
        problems.append("the decode host's turn was not last: %s" % result["order"])
    again = run_upgrade(None, "second run (nothing asks for a reboot)", playbook=MAINTENANCE)
    result.update(second_run_s=round(again.took, 1), second_run_changed=sum(again.changed.values()),
                  second_run_exit=again.rc)
    if again.rc or sum(again.changed.values()):
        problems.append("the second run exit %d changed %s" % (again.rc, again.changed))
    return problems


def restore_vip(result):
    """keepalived's nopreempt leaves the address where the last move put it; the lab's tests expect it on the first
    front door (the plan's order), so it goes back there: keepalived stops and starts again on the holder. Once the
    load has ended: this move too ends the streams open on the holder's front door."""
    frontdoor = inventory.plan(SERVING_INVENTORY)["frontdoor"]
    holder = result["vip_holder_after"] = vip_holder(frontdoor["vip"]["address"], frontdoor["hosts"])
    first = frontdoor["hosts"][0]
    if holder and holder != first:
        subprocess.run(["podman", "exec", holder, "systemctl", "stop", "keepalived"], check=True)
        deadline = time.monotonic() + 30
        while vip_holder(frontdoor["vip"]["address"], frontdoor["hosts"]) != first and time.monotonic() < deadline:
            time.sleep(0.5)
        subprocess.run(["podman", "exec", holder, "systemctl", "start", "keepalived"], check=True)


def driver_scenario(scenario, tmp, result):
    """driver: A -> B host by host, a second run, back to A. driver-link-down: A -> B where lab-prefill-1
    comes back with a link down: the run stops there naming it; then back to A."""
    problems = []
    manifest = yaml.safe_load((ROOT / "inventories/b300/group_vars/all/versions.yml").read_text())["pdctl_versions"]
    old = manifest["nvidia_driver"]
    new = yaml.safe_load((INVENTORY / "group_vars/all/lab_hardware.yml").read_text())["pdctl_lab_driver_rehearsal_versions"][0]
    result.update(driver_from=old, driver_to=new)
    link_down = scenario == "driver-link-down"
    target = driver_vars(tmp, new, LINK_DOWN_HOST if link_down else None)
    if link_down:
        # The fault goes into the emulated hardware before the run (the bench writes it: maintenance.yml never
        # does); it shows only once the new release's module is loaded, by the host's turn.
        problems += set_hardware(["-e", "@%s" % target], "the link-down fault under driver %s" % new)
    up = run_upgrade(target, "maintenance (driver %s)" % new, playbook=MAINTENANCE)
    result["upgrade_s"] = round(up.took, 1)
    report = json.loads(REPORT.read_text())
    result["hosts_s"] = {h: t["seconds"] for h, t in report["turns"].items()}
    result["activation"] = {h: t["activation"] for h, t in report["turns"].items()}
    drivers = host_drivers()
    result["drivers_after"] = {h: d["module"] for h, d in drivers.items()}
    if not link_down:
        if up.rc:
            problems.append("maintenance exit %d: %s" % (up.rc, " | ".join(up.tail)[:400]))
        for host in LAB_HOSTS:
            if not _on(drivers, host, new):
                problems.append("%s is not on %s with driver == fabric manager == nscq, fabric Completed: %s"
                                % (host, new, drivers[host]))
        again = run_upgrade(driver_vars(tmp, new), "second run (same manifest)", playbook=MAINTENANCE)
        result.update(second_run_s=round(again.took, 1), second_run_changed=sum(again.changed.values()),
                      second_run_exit=again.rc)
        if again.rc or sum(again.changed.values()):
            problems.append("the second run exit %d changed %s" % (again.rc, again.changed))
    else:
        failed = {h: t["failure"] for h, t in report["turns"].items() if not t["passed"]}
        result["failed_host"] = sorted(failed)
        result["reason"] = " ".join(str(f.get("reason", "")) for f in failed.values())[:200]
        if up.rc == 0 or set(failed) != {LINK_DOWN_HOST} or ("%s is out of service" % LINK_DOWN_HOST) not in up.stdout:
            problems.append("the run did not stop at %s (exit %d, failed %s): %s"
                            % (LINK_DOWN_HOST, up.rc, sorted(failed), " | ".join(up.tail)[:400]))
        if not _on(drivers, "lab-prefill-0", new) or drivers["lab-decode-0"]["module"] != old:
            problems.append("expected lab-prefill-0 on %s and lab-decode-0 untouched on %s: %s" % (new, old, drivers))
        healthy = FrontdoorCapacity(FRONTDOOR_HOST).sample().get("healthy", [])
        result["prefill_serving_after_stop"] = len(healthy)
        if len(healthy) != 2:
            problems.append("after the stop %d prefill instances serve, expected the other host's 2" % len(healthy))
    back = run_upgrade(None, "back to the manifest's driver %s" % old, playbook=MAINTENANCE)
    result["restore_s"] = round(back.took, 1)
    result["restore_hosts_s"] = {h: t["seconds"] for h, t in json.loads(REPORT.read_text())["turns"].items()}
    drivers = host_drivers()
    if back.rc or not all(_on(drivers, h, old) for h in LAB_HOSTS):
        problems.append("restore exit %d, hosts %s" % (back.rc, drivers))
    if link_down:
        problems += set_hardware([], "the inventory's own (no fault)")
    return problems


def set_hardware(extra_args, label):
    """The lab hosts' emulated hardware from the serving inventory and extra_args (`pdctl-lab hardware`); the
    problems, none when it was written."""
    log("emulated hardware: %s" % label)
    result = hardware.apply(SERVING_INVENTORY, extra_args=extra_args)
    return [] if result.ok else ["emulated hardware (%s) not written: %s" % (label, result.failures)]


if __name__ == "__main__":
    sys.exit(main())
