"""`pdctl report -i INVENTORY`: what is deployed where, and the latest rollout verdicts."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import topology


def _latest_gate_reports(artifacts: Path) -> list[tuple[str, dict, Path]]:
    found = []
    for kind in ("accuracy", "sla"):
        reports = sorted(artifacts.glob("gates/*/%s.json" % kind), key=lambda p: p.stat().st_mtime)
        if reports:
            try:
                found.append((kind, json.loads(reports[-1].read_text()), reports[-1]))
            except (OSError, ValueError):
                continue
    return found


def main(args) -> int:
    from pdctl import inventory
    try:
        plan = inventory.plan(args.inventory)
    except (inventory.InventoryError, topology.PlanError) as exc:
        print("pdctl report: %s" % exc, file=sys.stderr)
        return 2
    print("== serving plan (%s)" % args.inventory)
    print(topology.format_table(plan))
    print("\n== serving mode (each front door's router checks)")
    for line in mode_lines(plan):
        print(line)
    artifacts = Path(args.artifacts) if args.artifacts else inventory.artifacts_dir(args.inventory)
    for line in _quarantine_lines(artifacts / "quarantine" / "last.json"):
        print(line)
    for line in _maintenance_lines(artifacts / "maintenance" / "last.json"):
        print(line)
    gates = _latest_gate_reports(artifacts)
    print("\n== rollout gates")
    if not gates:
        print("no gate report under %s yet" % (artifacts / "gates"))
    verdict = 0
    for kind, data, path in gates:
        passed = bool(data.get("passed"))
        verdict |= 0 if passed else 1
        print("%-8s %s  (%s)" % (kind, "PASS" if passed else "FAIL", path.with_suffix(".md")))
        for line in _gate_lines(kind, data):
            print("  " + line)
    return verdict


# The serving modes (docs/decode-loss.md), from which routers a front door has UP in be_routers.
MODES = {"pd": "P/D", "aggregated": "DEGRADED (aggregated: the prefill instances serve whole requests)",
         "down": "DOWN (no router can serve: the front door answers 503)"}


def serving_mode(metrics_text: str) -> tuple[str, list[str]]:
    """("pd" | "aggregated" | "down", the routers UP) from a front door's Prometheus endpoint (HAProxy's
    haproxy_server_status of be_routers, as its /readiness checks left it): pd while a P/D router is UP,
    aggregated while only *-aggregated ones are, down when none is."""
    up = []
    for line in metrics_text.splitlines():
        if not line.startswith("haproxy_server_status{") or 'proxy="be_routers"' not in line:
            continue
        labels, _, value = line.rpartition("} ")
        fields = dict(part.split("=", 1) for part in labels[len("haproxy_server_status{"):].split(",") if "=" in part)
        if fields.get("state") == '"UP"' and float(value) == 1:
            up.append(fields.get("server", "").strip('"'))
    if any(not name.endswith("-aggregated") for name in up):
        return "pd", up
    return ("aggregated" if up else "down"), up


def mode_lines(plan, timeout=3.0):
    """One line per front-door host: its serving mode, or why it could not be read."""
    import urllib.request

    fd = plan.get("frontdoor")
    if not fd:
        yield "no front door planned"
        return
    if fd.get("vip"):
        yield "clients: %s (virtual address, held by one front-door host at a time)" % fd["url"]
    for host, address in zip(fd["hosts"], fd["addresses"]):
        url = "http://%s:%d/metrics" % (address, fd["metrics_port"])
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                mode, up = serving_mode(resp.read().decode(errors="replace"))
        except OSError as exc:
            yield "%-16s UNKNOWN: %s unreachable (%s)" % (host, url, getattr(exc, "reason", exc))
            continue
        yield "%-16s %s; routers up: %s" % (host, MODES[mode], ", ".join(up) or "none")


def _last_json(path: Path):
    """The record a playbook left at path (a dict), or None when there is none or it is unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _quarantine_lines(path: Path):
    """The last host-stack check's quarantine verdict (host_stack.yml writes it), if any."""
    data = _last_json(path)
    if data is None:
        return
    age = time.time() - float(data.get("time") or 0)
    minimum = data.get("min_prefill_instances")
    yield "\n== quarantine (host-stack checks %s ago; pdctl_min_prefill_instances %s)" % (
        _age(age), minimum if minimum is not None else "unset: a failed host fails the run")
    quarantined = data.get("quarantined") or []
    if not quarantined:
        yield "no host quarantined"
    for q in quarantined:
        yield "QUARANTINED %s (%s): out of every router, instances stopped" % (
            q.get("host"), ", ".join(q.get("instances") or []))
        yield "  " + str(q.get("reason"))


def _maintenance_lines(path: Path):
    """The last host maintenance run (playbooks/maintenance.yml writes it), if any: each host's turn."""
    data = _last_json(path)
    if data is None:
        return
    hosts, turns = data.get("hosts") or [], data.get("turns") or {}
    yield "\n== host maintenance (%s ago, NVIDIA driver %s)" % (_age(time.time() - float(data.get("time") or 0)),
                                                              data.get("driver"))
    if not hosts:
        yield "nothing to do: every host ran the manifest's driver with its instances up"
    for host in hosts:
        turn = turns.get(host)
        if turn is None:
            yield "NOT TOUCHED %s (the run stopped before its turn)" % host
        elif turn.get("passed"):
            yield "done %s in %s s (%s)" % (host, turn.get("seconds"), turn.get("activation"))
        else:
            failure = turn.get("failure") or {}
            yield "OUT OF SERVICE %s after %s s (%s): %s" % (host, turn.get("seconds"), turn.get("activation"),
                                                              failure.get("task"))
            yield "  " + str(failure.get("reason"))


def _age(seconds):
    seconds = max(0, int(seconds))
    if seconds < 120:
        return "%d s" % seconds
    return "%d min" % (seconds // 60) if seconds < 7200 else "%d h" % (seconds // 3600)


def _gate_lines(kind, data):
    if kind == "sla":
        limits = data.get("limits") or {}
        yield "limits: mean TTFT <= %s ms, mean TPOT <= %s ms" % (limits.get("max_ttft_ms"), limits.get("max_tpot_ms"))
        for run in data.get("runs") or []:
            yield ("context %6d, concurrency %3d: mean TTFT %8.1f ms, mean TPOT %6.2f ms, %d/%d completed%s"
                   % (run["input_len"], run["concurrency"], run["mean_ttft_ms"], run["mean_tpot_ms"],
                      run["completed"], run["num_prompts"], "" if run.get("passed") else "  <- FAIL"))
        for run in data.get("unmeasured") or []:
            yield "context %6d: not measured (the benchmark client failed twice)  <- FAIL" % run["input_len"]
    else:
        for name, b in sorted((data.get("benchmarks") or {}).items()):
            yield ("%-9s %3d/%-3d correct (%.1f%%), floor %d, parse rate %.0f%%%s"
                   % (name, b["correct"], b["samples"], 100 * b["accuracy"], b["floor"], 100 * b["parse_rate"],
                      "" if b["passed"] else "  <- FAIL"))
    for failure in data.get("failures") or []:
        yield "failure: %s" % failure


def add_parser(sub):
    p = sub.add_parser("report", help="the rollout report: plan, hosts, latest gate verdicts")
    p.add_argument("-i", "--inventory", required=True)
    p.add_argument("--artifacts", help="the run records' directory (default: the inventory's pdctl_artifacts_dir)")
    p.set_defaults(func=main)
