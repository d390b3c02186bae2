"""`pdctl report -i INVENTORY`: what is deployed where, and the latest rollout verdicts."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from pdctl import collection
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
    if Path(args.inventory).resolve() == (collection.root() / "inventories" / "lab").resolve():
        from pdctl.lab import hosts

        print("\n== lab hosts")
        hosts.status()
    artifacts = Path(args.artifacts)
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
    p.add_argument("--artifacts", default=str(collection.root() / "artifacts"))
    p.set_defaults(func=main)
