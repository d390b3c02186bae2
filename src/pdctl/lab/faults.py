"""Decode loss under load on the lab, measured (issue 39): run() returns the JSON line
benchmarks/faults.py prints; tests/integration/test_decode_loss_lab.py runs a short decode-kill.

8 streaming clients run through the front door (every request judged by pdctl.outcome's rule: HTTP 200,
[DONE], finish_reason stop/length, the token count asked for); the fault comes FAULT_AT_S (10 s) in; a
sampler inside the front-door host reads HAProxy's router servers every 0.2 s and says which mode the
front door is in: "pd" (a P/D router is up), "aggregated" (only an aggregated router, server *-aggregated,
is up: the prefill instances serve whole requests) or "down".

Scenarios:
  decode-kill       kill -9 of the decode instance's main process; systemd restarts it (Restart=on-failure).
  decode-crashloop  the decode unit's main process exits 1 at start (a drop-in replaces its ExecStart) and the
                    running one is killed: systemd restarts it every RestartSec and it dies each time; after
                    CRASHLOOP_S (60 s) the drop-in goes and the next restart comes up.
  decode-host-loss  link down and `podman kill` of the decode host's container (the decode instance, a P/D router, a front
                    door and the virtual address's first holder go at once, as at a power loss); after
                    HOST_DOWN_S (30 s) `podman start` brings it back and its units start as at a boot. The
                    clients use the front door's virtual address (keepalived moves it to the other front door).

Clients always use the plan's front-door URL (the virtual address when there is one). The mode is read on a
front-door host that is not the decode host (it survives every scenario).

The JSON line: scenario, requests, failed_requests, in_flight_at_fault (requests started before the fault
and not finished at it), failed_started_after_grace (failures among requests started grace_s or more after
the fault), grace_s, first_ok_after_fault_s (when the first request started after the fault finished ok),
degraded_s (time in aggregated mode), back_to_pd_s (from the decode answering /health again to the front
door in P/D mode), degraded_mean_tpot_ms (the prefill instances' mean TPOT over the run: only whole
requests, aggregated ones, have more than one token there), prefill_restarts, failed_by_kind, verdict.
Acceptance: failed_requests <= in_flight_at_fault, failed_started_after_grace == 0, back_to_pd_s reported,
prefill_restarts == 0.

The lab must be up and converged (`scripts/lab`); run under the lab lock. Progress on stderr.
"""
from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
import threading
import time

from pdctl import collection, inventory
from pdctl.lab import stage
from pdctl.lab.load import HAPROXY_ASK, StreamLoad

ROOT = collection.root()
INVENTORY = ROOT / "inventories" / "lab"
CA = str(ROOT / ".lab" / "tls" / "ca.pem")
SCENARIOS = ["decode-kill", "decode-crashloop", "decode-host-loss"]
FAULT_AT_S = 10.0
GRACE_S = 5.0
CRASHLOOP_S = 60.0
HOST_DOWN_S = 30.0
# Long enough for a request the P/D router took in the second before the front door saw the host gone: the
# router waits ~10 s to connect to the lost decode, fails it, and the front door retries it aggregated
# (ok after ~10 s). A stream whose front door was on the lost host fails after this much silence.
HOST_LOSS_CLIENT_TIMEOUT_S = 30.0
# After P/D is back, the load runs this much longer (requests that started aggregated finish there).
TAIL_S = 10.0
CRASHLOOP_DROPIN = "zz-pdctl-faults-crashloop.conf"

# Runs inside the front-door host: every 0.2 s, one JSON line with the router servers HAProxy has UP
# (aggregated: the *-aggregated servers; pd: the others). The stat columns are read by name.
_MODE_PROBE = HAPROXY_ASK + r"""
while True:
    try:
        lines = ask("show stat").splitlines()
        cols = lines[0][2:].split(",")
        pd, agg = [], []
        for line in lines[1:]:
            row = dict(zip(cols, line.split(",")))
            # "UP 1/2": a check failed, not yet out; still serving.
            if row.get("pxname") == "be_routers" and row["svname"] not in ("FRONTEND", "BACKEND") and row["status"].startswith("UP"):
                (agg if row["svname"].endswith("-aggregated") else pd).append(row["svname"])
        print(json.dumps({"t": time.time(), "pd": pd, "aggregated": agg}), flush=True)
    except OSError as exc:
        print(json.dumps({"t": time.time(), "error": str(exc)}), flush=True)
    time.sleep(0.2)
"""


def log(msg):
    print("[faults bench %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def client_key():
    """The lab's `tester` client (made by `pdctl-lab up`)."""
    return stage.client_key(ROOT / ".lab")


def on_host(host, *argv, check=True):
    res = subprocess.run(["podman", "exec", host, *argv], capture_output=True, text=True)
    if check and res.returncode:
        raise RuntimeError("%s on %s: rc %d %s" % (" ".join(argv), host, res.returncode, res.stderr[-300:]))
    return res.stdout


class ModeSampler(threading.Thread):
    """The front door's mode over time: samples [(wall time, "pd" | "aggregated" | "down")]."""

    def __init__(self, host=None):
        host = host or survivor(inventory.plan(INVENTORY), "frontdoor")
        super().__init__(daemon=True)
        self.samples = []
        self.proc = subprocess.Popen(["podman", "exec", "-i", host, "python3", "-u", "-c", _MODE_PROBE],
                                     stdout=subprocess.PIPE, text=True)

    def run(self):
        for line in self.proc.stdout:
            reading = json.loads(line)
            if "error" in reading:
                continue
            mode = "pd" if reading["pd"] else "aggregated" if reading["aggregated"] else "down"
            self.samples.append((reading["t"], mode))

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.join(10)

    def mode(self):
        return self.samples[-1][1] if self.samples else None

    def first(self, mode, after):
        """Wall time of the first sample in this mode at or after `after`, else None."""
        return next((t for t, m in self.samples if t >= after and m == mode), None)

    def time_in(self, mode):
        """Seconds the samples spent in this mode (each sample counts until the next)."""
        return sum(b[0] - a[0] for a, b in zip(self.samples, self.samples[1:]) if a[1] == mode)


def _wall(stamp):
    """Prometheus' RFC 3339 time (nanoseconds, Z) as a wall-clock second."""
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", stamp).replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()


class AlertWatcher(threading.Thread):
    """Which pdctl alerts the lab's Prometheus (plan: the first router host, port 9090) reports firing, polled
    every 2 s: firing = {alertname: first wall time seen firing}, for alerts that became active after the watcher
    started (one still firing from before, e.g. from the slow-start profile's restart of every engine, is not
    this fault's)."""

    def __init__(self, url):
        super().__init__(daemon=True)
        self.url, self.firing, self.errors = url, {}, []
        self.since = time.time()
        self._halt = threading.Event()

    def run(self):
        import httpx
        while not self._halt.is_set():
            try:
                alerts = httpx.get(self.url + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]
                for a in alerts:
                    active = _wall(a["activeAt"]) if a.get("activeAt") else time.time()
                    if a["state"] == "firing" and active >= self.since:
                        self.firing.setdefault(a["labels"]["alertname"], time.time())
            except Exception as exc:  # noqa: BLE001 - a missed poll is only a gap in the record
                self.errors.append(repr(exc)[:200])
            self._halt.wait(2)

    def stop(self):
        self._halt.set()
        self.join(10)


def survivor(plan, role):
    """A front-door ("frontdoor") or router ("router") host other than the decode host when the plan has one
    (it outlives a decode-host loss), else the first."""
    decode_hosts = {i["host"] for i in plan["instances"] if i["pool"] == "decode"}
    hosts = plan["frontdoor"]["hosts"] if role == "frontdoor" else [r["host"] for r in plan["routers"]]
    return next((h for h in hosts if h not in decode_hosts), hosts[0])


def wait_for(predicate, timeout, what, poll=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise RuntimeError("%s: not within %d s" % (what, timeout))


def unit_state(host, unit):
    out = on_host(host, "systemctl", "show", "-p", "MainPID", "-p", "NRestarts", "-p", "ActiveState", unit)
    return dict(line.split("=", 1) for line in out.split())


def back_up(host, unit, pid_before):
    """The unit runs a new main process that answers /health (False while its host is still starting)."""
    try:
        return unit_state(host, unit)["MainPID"] not in ("0", pid_before)
    except RuntimeError:
        return False


def healthy(host, url):
    """The instance answers /health 200, asked from its own host (the firewall admits it)."""
    code = on_host(host, "python3", "-c", "import urllib.request,sys\ntry:\n print(urllib.request.urlopen("
                   "sys.argv[1] + '/health', timeout=2).status)\nexcept Exception:\n print(0)", url, check=False)
    return code.strip() == "200"


def tpot_totals(plan):
    """(sum, count) of vllm:request_time_per_output_token_seconds over the prefill instances, read from the
    router host that outlives a decode-host loss (instance API ports admit only the router hosts)."""
    router_host = survivor(plan, "router")
    total, count = 0.0, 0.0
    for inst in (i for i in plan["instances"] if i["pool"] == "prefill"):
        text = on_host(router_host, "python3", "-c", "import urllib.request,sys\n"
                       "print(urllib.request.urlopen(sys.argv[1] + '/metrics', timeout=5).read().decode())",
                       inst["url"], check=False)
        for line in text.splitlines():
            if line.startswith("vllm:request_time_per_output_token_seconds_sum"):
                total += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:request_time_per_output_token_seconds_count"):
                count += float(line.rsplit(" ", 1)[1])
    return total, count


def prefill_units(plan):
    return [(i["host"], i["unit"]) for i in plan["instances"] if i["pool"] == "prefill"]


def crashloop_dropin(host, unit, present):
    path = "/etc/systemd/system/%s.d/%s" % (unit, CRASHLOOP_DROPIN)
    if present:
        # Its main process exits 1 at once, every restart (as an engine that cannot load its weights would),
        # until the drop-in goes. (Environment= would not do: the unit's EnvironmentFile= overrides it.)
        on_host(host, "sh", "-c", "mkdir -p /etc/systemd/system/%s.d && printf '%%s\\n' '[Service]' 'ExecStart=' "
                "'ExecStart=/bin/sh -c \"echo pdctl faults bench: the engine exits at start; exit 1\"' > %s"
                % (unit, path))
    else:
        on_host(host, "rm", "-f", path)
    on_host(host, "systemctl", "daemon-reload")


def run(scenario, clients=8, max_tokens=24, fault_at_s=FAULT_AT_S, crashloop_s=CRASHLOOP_S, tail_s=TAIL_S,
        grace_s=GRACE_S, host_down_s=HOST_DOWN_S):
    """The scenario under load; returns the result dict (the JSON line)."""
    plan = inventory.plan(INVENTORY)
    decode = next(i for i in plan["instances"] if i["pool"] == "decode")
    frontdoor = plan["frontdoor"]["url"]  # the virtual address when there is one
    result = {"scenario": scenario, "requests": 0, "failed_requests": 0, "in_flight_at_fault": 0,
              "failed_started_after_grace": 0, "grace_s": grace_s, "first_ok_after_fault_s": None,
              "degraded_s": None, "back_to_pd_s": None, "degraded_mean_tpot_ms": None, "prefill_restarts": None,
              "decode_restarts": None, "verdict": None}
    problems = []
    prefill_before = {u: unit_state(h, u) for h, u in prefill_units(plan)}
    decode_before = unit_state(decode["host"], decode["unit"])
    tpot_before = tpot_totals(plan)
    sampler = ModeSampler()
    sampler.start()
    alerts = AlertWatcher("http://%s:9090" % plan["routers"][0]["address"])
    alerts.start()
    wait_for(lambda: sampler.mode() == "pd", 30, "the front door in P/D mode before the fault")
    offset = time.time() - time.monotonic()  # StreamLoad's times are monotonic; the sampler's wall
    try:
        # A lost host answers nothing: its streams end only by the client's own inactivity timeout (as a real
        # client's would), here HOST_LOSS_CLIENT_TIMEOUT_S instead of 120 s.
        timeout = HOST_LOSS_CLIENT_TIMEOUT_S if scenario == "decode-host-loss" else 120
        with StreamLoad(frontdoor, client_key(), clients=clients, max_tokens=max_tokens, verify=CA,
                        timeout=timeout) as load:
            time.sleep(fault_at_s)
            if scenario == "decode-crashloop":
                crashloop_dropin(decode["host"], decode["unit"], True)
            fault = time.time()
            if scenario == "decode-host-loss":
                # A host that loses power sends nothing more. `podman kill` alone does not look like that:
                # its network namespace outlives the processes for ~0.6 s and answers every connection with
                # a reset (355 "connection refused" in one run), so the link goes down first.
                subprocess.run(["podman", "exec", decode["host"], "ip", "link", "set", "dev", "eth0", "down"],
                               check=True, capture_output=True)
                subprocess.run(["podman", "kill", decode["host"]], check=True, capture_output=True)
                log("%s: killed the host %s (link down, podman kill)" % (scenario, decode["host"]))
                time.sleep(host_down_s)
                subprocess.run(["podman", "start", decode["host"]], check=True, capture_output=True)
                log("%s: %s started again after %.0f s" % (scenario, decode["host"], time.time() - fault))
            else:
                on_host(decode["host"], "kill", "-9", decode_before["MainPID"])
                log("%s: killed %s (pid %s)" % (scenario, decode["unit"], decode_before["MainPID"]))
            if scenario == "decode-crashloop":
                time.sleep(crashloop_s)
                crashes = int(unit_state(decode["host"], decode["unit"])["NRestarts"]) - int(decode_before["NRestarts"])
                log("crash loop: %d restarts in %d s; the engine's profile back" % (crashes, crashloop_s))
                if crashes < 2:
                    problems.append("the decode unit restarted %d times in %d s: no crash loop" % (crashes, crashloop_s))
                crashloop_dropin(decode["host"], decode["unit"], False)
            wait_for(lambda: (back_up(decode["host"], decode["unit"], decode_before["MainPID"])
                              and healthy(decode["host"], decode["url"])), 240, "the decode instance back", poll=0.5)
            restored = time.time()
            log("decode answers /health again %.1f s after the fault" % (restored - fault))
            back = wait_for(lambda: sampler.first("pd", restored), 60, "the front door back in P/D mode")
            log("front door in P/D mode %.1f s after the decode was back" % (back - restored))
            time.sleep(tail_s)
    finally:
        if scenario == "decode-crashloop":
            crashloop_dropin(decode["host"], decode["unit"], False)
        sampler.stop()
        alerts.stop()
    tpot_after = tpot_totals(plan)
    summary = load.summary()
    fault_m = fault - offset
    in_flight = [o for o in load.outcomes if o.start < fault_m < o.end]
    after_grace = [o for o in load.failed() if o.start >= fault_m + grace_s]
    first_ok = min((o.end for o in load.outcomes if o.ok and o.start >= fault_m), default=None)
    prefill_after = {u: unit_state(h, u) for h, u in prefill_units(plan)}
    degraded_start = sampler.first("aggregated", fault)
    tpot_n = tpot_after[1] - tpot_before[1]
    result.update(
        requests=summary["requests"], failed_requests=summary["failed_requests"],
        failed_by_kind=summary["failed_by_kind"], errors=summary["errors"],
        in_flight_at_fault=len(in_flight), failed_started_after_grace=len(after_grace),
        first_ok_after_fault_s=round(first_ok - fault_m, 2) if first_ok is not None else None,
        detected_s=round(degraded_start - fault, 2) if degraded_start else None,
        degraded_s=round(sampler.time_in("aggregated"), 1),
        down_s=round(sampler.time_in("down"), 1),
        decode_back_s=round(restored - fault, 1),
        back_to_pd_s=round(back - restored, 2),
        degraded_mean_tpot_ms=round(1000 * (tpot_after[0] - tpot_before[0]) / tpot_n, 1) if tpot_n else None,
        prefill_restarts=sum(int(prefill_after[u]["NRestarts"]) - int(prefill_before[u]["NRestarts"])
                             + (prefill_after[u]["MainPID"] != prefill_before[u]["MainPID"]) for u in prefill_after),
        # A host that booted again counts its units' restarts from 0.
        decode_restarts=(None if scenario == "decode-host-loss" else
                         int(unit_state(decode["host"], decode["unit"])["NRestarts"]) - int(decode_before["NRestarts"])),
        # Seconds from the fault to Prometheus reporting the alert firing (None: not seen; it holds for 10 s
        # after a 5 s scrape, so a short degraded spell may end first).
        degraded_alert_s=(round(alerts.firing["PdctlDegradedMode"] - fault, 1)
                          if "PdctlDegradedMode" in alerts.firing else None),
        prefill_down_alert=("PdctlPrefillDown" in alerts.firing))
    if result["failed_requests"] > result["in_flight_at_fault"]:
        problems.append("%d failed requests, more than the %d in flight at the fault: %s"
                        % (result["failed_requests"], result["in_flight_at_fault"], summary["errors"]))
    if result["failed_started_after_grace"]:
        problems.append("%d requests started %g s or more after the fault failed"
                        % (result["failed_started_after_grace"], grace_s))
    if result["prefill_restarts"]:
        problems.append("%d prefill restarts" % result["prefill_restarts"])
    if not result["degraded_s"]:
        problems.append("the front door never went to aggregated mode")
    if result["prefill_down_alert"]:
        problems.append("PdctlPrefillDown fired: the prefill pool was never down")
    result["verdict"] = "pass" if not problems else "fail: " + "; ".join(problems)
    return result
