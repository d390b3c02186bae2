"""`pdctl run PLAYBOOK -i INVENTORY`: any of the collection's playbooks through ansible-runner, for CI.

Writes what a CI system reads: a JSON summary (per host ok/changed/failed, the failed tasks and their
messages, the gate verdicts and figures, the artifact directory) and a JUnit XML file (one test case
per play and host; a failure carries the task and its message). ansible-runner's event artifacts are
kept under --artifacts. Exit codes tell the outcome apart:

  0  accepted                       3  a gate failed (the failing gate is named in both files)
  2  the inventory was rejected     4  a host was unreachable
  1  anything else
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from ansible_collections.pdctl.vllm_pd.plugins.filter import rollout as rollout_filter
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import admission, topology

from pdctl import inventory, runner

EXIT_OK, EXIT_OTHER, EXIT_INVALID, EXIT_GATE, EXIT_UNREACHABLE = 0, 1, 2, 3, 4
# roles/preflight reports its verdict on the inventory through set_stats, before it asserts it:
# {"ok": bool, "problems": [...]}; not ok means the inventory was rejected.
PLAN_REPORT = "pdctl_plan"
# That assert, for a run that reported no verdict (a collection from before the report).
PLAN_TASK = "Inventory describes a valid P/D deployment"
# playbooks/gates.yml reports its verdict through set_stats, before it asserts it.
GATES_VERDICT = "pdctl_gates_verdict"
# playbooks/upgrade.yml reports how it ended through set_stats, before its last task asserts it:
# {"verdict": accepted | rolled-back | rejected | check, "rolled_back", "passed", "reason", "kind", "target_release"}
# (plugins/module_utils/upgrade_decide.py, outcome()); "rejected": the gates rejected the change, which was rolled back.
UPGRADE_REPORT = "pdctl_upgrade"
# upgrade.yml's last task, for a run that reported no verdict (a playbook from before the report): it fails when
# the gates rejected a release or a prefill change.
UPGRADE_VERDICT_TASK = "Upgrade done, or rolled back"
# upgrade_pass.yml's and maintenance.yml's plan of the run (rollout_plan's lines), printed by pdctl: reported
# through set_stats as a list of lines; the task that prints them for a run that reported none.
ROLLOUT_PLAN_REPORT = "pdctl_rollout_plan"
ROLLOUT_PLAN_TASK = "Rollout plan"
# What --plan reads from the inventory: the timing model and the front door's limits (admission.share).
PLAN_PRINT_VARS = ("pdctl_rollout_timing", "pdctl_rollout_prefill_keep", "pdctl_frontdoor_max_inflight",
                   "frontdoor_max_queue")


def add_parser(sub):
    p = sub.add_parser("run", help="run a playbook through ansible-runner and write JSON/JUnit results (CI)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("playbook", help="a playbook of the collection (site.yml, playbooks/gates.yml, ...) or a path")
    _common_args(p)
    p.set_defaults(func=_cmd_run)
    # The same run for one playbook, under the verb an operator looks for.
    u = sub.add_parser("upgrade", help="rolling upgrade to what the inventory says (playbooks/upgrade.yml): "
                       "one instance at a time, no request lost; --check prints the steps")
    _common_args(u)
    u.add_argument("--plan", choices=["prefill", "decode", "release"],
                   help="print the steps, capacity and estimated duration of a change of every prefill instance, "
                   "of the decode instance(s) (behind a temporary decode) or of a new engine release, from the "
                   "inventory alone (no host is contacted; nothing runs)")
    u.set_defaults(func=_cmd_run, playbook="playbooks/upgrade.yml")
    r = sub.add_parser("rollback", help="back to the engine release before the last switch (playbooks/upgrade.yml "
                       "-e upgrade_rollback=true): the same two-pool switch, then the gates")
    _common_args(r)
    r.add_argument("--prefill", action="store_true",
                   help="undo the last change of the prefill instances' configuration (flags, environment) instead: "
                   "the configuration each host recorded before it, rolled one instance at a time, then the gates")
    r.set_defaults(func=_cmd_run, playbook="playbooks/upgrade.yml", rollback=True)
    m = sub.add_parser("maintain", help="host maintenance (playbooks/maintenance.yml): the driver release of the "
                       "manifest, one host at a time (--limit HOST for one), out of service and back, no request lost")
    _common_args(m)
    m.add_argument("--plan", choices=["maintenance"], nargs="?", const="maintenance",
                   help="print the steps, capacity and estimated duration of every host's turn, from the inventory "
                   "alone (no host is contacted; nothing runs)")
    m.set_defaults(func=_cmd_run, playbook="playbooks/maintenance.yml")


def _common_args(p):
    p.add_argument("-i", "--inventory", required=True)
    p.add_argument("--check", action="store_true", help="check mode (with --diff)")
    p.add_argument("--diff", action="store_true", help="show what changes, as ansible-playbook --diff")
    p.add_argument("--limit", help="limit to these hosts (Ansible pattern)")
    p.add_argument("--tags", help="only these tags")
    p.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS",
                   help="extra variables, as for ansible-playbook (key=value, JSON or @file); repeatable")
    p.add_argument("--json", type=Path, help="write the JSON summary here")
    p.add_argument("--junit", type=Path, help="write the JUnit XML here")
    p.add_argument("--artifacts", type=Path, help="ansible-runner's directory (default runs/<time> under the inventory's pdctl_artifacts_dir)")


def _progress_printer(stream):
    """One line per play and a task line updated in place, on a terminal only."""
    if not stream.isatty():
        return None
    state = {"task": None, "done": 0}

    def show(kind, data):
        if kind == "playbook_on_play_start":
            stream.write("\n== %s\n" % (data.get("play") or data.get("name")))
        elif kind == "playbook_on_task_start":
            state.update(task=data.get("task"), done=0)
            stream.write("\r\033[K  %s" % state["task"])
        elif kind.startswith("runner_on_") and state["task"]:
            state["done"] += 1
            stream.write("\r\033[K  %s (%d host%s done)" % (state["task"], state["done"],
                                                             "" if state["done"] == 1 else "s"))
        stream.flush()
    return show


def exit_code(result: runner.PlaybookResult) -> int:
    if result.ok:
        return EXIT_OK
    if inventory_rejected(result):
        return EXIT_INVALID
    if any(f.get("unreachable") for f in result.failures):
        return EXIT_UNREACHABLE
    if failed_gates(result) or gates_rejected(result) or upgrade_rejected(result):
        return EXIT_GATE
    return EXIT_OTHER


def inventory_rejected(result: runner.PlaybookResult) -> bool:
    """Preflight rejected the inventory: from its report (set_stats), or, where it reported none, its plan task's
    failure."""
    report = result.reported.get(PLAN_REPORT)
    if isinstance(report, dict):
        return not report.get("ok")
    return any(f["task"] == PLAN_TASK for f in result.failures)


def rollout_plan(result: runner.PlaybookResult) -> list[str] | None:
    """The rollout plan's lines that upgrade.yml / maintenance.yml reported (set_stats), or, where they reported
    none, the message of their task that prints them; None when the run made no plan."""
    lines = result.reported.get(ROLLOUT_PLAN_REPORT)
    if isinstance(lines, list):
        return [str(line) for line in lines]
    for res in result.task_results(ROLLOUT_PLAN_TASK).values():
        return res.get("msg")
    return None


def upgrade_rejected(result: runner.PlaybookResult) -> bool:
    """The upgrade ended rejected by the gates (rolled back, or a requested rollback they rejected too): from its
    report (set_stats), or, where it reported none, its verdict task's failure."""
    report = result.reported.get(UPGRADE_REPORT)
    if report is not None:
        return report.get("verdict") == "rejected"
    return any(f["task"] == UPGRADE_VERDICT_TASK for f in result.failures)


def failed_gates(result: runner.PlaybookResult) -> list[str]:
    return sorted(name for name, res in result.gates.items() if not res.get("passed"))


def gates_rejected(result: runner.PlaybookResult) -> dict | None:
    """The gates' verdict (playbooks/gates.yml's set_stats, with the play that reported it) when it rejected
    the rollout and was enforced (so the play failed on it), else None."""
    verdict = result.reported.get(GATES_VERDICT)
    return verdict if verdict and not verdict.get("passed") and verdict.get("enforced") else None


def summary(result: runner.PlaybookResult, playbook: str, inventory_path: str, code: int, wall_s: float) -> dict:
    hosts = {}
    for out in result.outcomes:
        h = hosts.setdefault(out["host"], {"ok": 0, "changed": 0, "failed": 0, "unreachable": 0, "skipped": 0})
        for key in h:
            h[key] += out[key]
    gates = {}
    for name, res in result.gates.items():
        gates[name] = {"passed": bool(res.get("passed")), "failures": res.get("failures") or [],
                       "files": res.get("files") or {}}
        for key in ("runs", "benchmarks", "capacity", "reused", "age_s"):
            if key in res:
                gates[name][key] = res[key]
    return {"playbook": playbook, "inventory": str(inventory_path), "exit_code": code,
            "outcome": {0: "accepted", 1: "failed", 2: "inventory rejected", 3: "gate failed",
                        4: "unreachable"}[code],
            "wall_s": round(wall_s, 1), "hosts": hosts,
            # What preflight found wrong with the inventory (its report, PLAN_REPORT), as a rejection before the run
            # writes it.
            **({"problems": list(result.reported[PLAN_REPORT].get("problems") or [])}
               if inventory_rejected(result) and isinstance(result.reported.get(PLAN_REPORT), dict) else {}),
            "failed_tasks": [{k: f.get(k) for k in ("host", "play", "task", "msg")} for f in result.failures],
            "gates": gates, "failed_gates": failed_gates(result),
            # Prefill hosts that failed their checks and were left out (pdctl_min_prefill_instances): their
            # failed check is also in failed_tasks, though the run was accepted.
            "quarantined": list(result.quarantine), "artifact_dir": str(result.artifact_dir),
            # How an upgrade ended (its report, UPGRADE_REPORT); absent for other playbooks.
            **({"upgrade": {k: v for k, v in result.reported[UPGRADE_REPORT].items() if k != "play"}}
               if UPGRADE_REPORT in result.reported else {})}


def junit(result: runner.PlaybookResult, playbook: str) -> ET.ElementTree:
    """One test case per play and host (as Ansible's own junit callback names them: play, then host)."""
    suites = ET.Element("testsuites", name="pdctl run %s" % playbook)
    by_play = {}
    for out in result.outcomes:
        by_play.setdefault(out["play"], []).append(out)
    gate_failures = {name: res for name, res in result.gates.items() if not res.get("passed")}
    rejected = gates_rejected(result)
    for play, outs in by_play.items():
        failed = sum(1 for o in outs if o["failure"])
        suite = ET.SubElement(suites, "testsuite", name=str(play), tests=str(len(outs)), failures=str(failed))
        for out in outs:
            case = ET.SubElement(suite, "testcase", classname=str(play), name=str(out["host"]))
            case.set("time", "0")
            if out["failure"]:
                f = out["failure"]
                message = "%s: %s" % (f["task"], f["msg"])
                # A gate module's failure, or any failure of the play whose gates verdict rejected the rollout.
                if f.get("action") in runner.GATE_ACTIONS or (rejected and f["play"] == rejected["play"]):
                    message = "gate failed (%s): %s" % (", ".join(sorted(gate_failures)) or "?", message)
                kind = "unreachable" if f.get("unreachable") else "failed"
                node = ET.SubElement(case, "failure", message=message[:1000], type=kind)
                node.text = message
            ET.SubElement(case, "system-out").text = "ok=%d changed=%d skipped=%d" % (
                out["ok"], out["changed"], out["skipped"])
    return ET.ElementTree(suites)


def _cmd_run(args) -> int:
    # Reject a malformed inventory before anything starts (preflight would stop it too, later); with the run's
    # extra vars, as the run will see it (a site may pass its front door's address with -e).
    try:
        inventory.plan(args.inventory, extra_vars=args.extra_vars)
    except (inventory.InventoryError, topology.PlanError) as exc:
        problems = getattr(exc, "problems", [str(exc)])
        print("pdctl run: %s is invalid:" % args.inventory, file=sys.stderr)
        for problem in problems:
            print("  - %s" % problem, file=sys.stderr)
        doc = {"playbook": args.playbook, "inventory": str(args.inventory), "exit_code": EXIT_INVALID,
               "outcome": "inventory rejected", "problems": problems, "hosts": {}, "failed_tasks": [],
               "gates": {}, "failed_gates": [], "quarantined": [], "artifact_dir": None}
        _write(args, doc, _rejected_junit(args.playbook, problems))
        return EXIT_INVALID
    if getattr(args, "plan", None):
        return _print_plan(args)
    extra = []
    if getattr(args, "rollback", False):
        extra = ["-e", "upgrade_rollback=%s" % ("prefill" if args.prefill else "true")]
    for value in args.extra_vars:
        extra += ["-e", value]
    if args.check or args.diff:
        extra.append("--diff")
    runs = inventory.artifacts_dir(args.inventory, args.extra_vars) / "runs"
    pdd = args.artifacts or runs / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    pdd.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    result = runner.run_playbook(args.playbook, args.inventory, check=args.check, limit=args.limit, tags=args.tags,
                                 extra_args=extra, quiet=True, private_data_dir=str(pdd.resolve()),
                                 progress=_progress_printer(sys.stderr))
    code = exit_code(result)
    doc = summary(result, args.playbook, args.inventory, code, time.monotonic() - t0)
    # upgrade.yml / maintenance.yml report their steps for what the hosts have to do (ROLLOUT_PLAN_REPORT).
    lines = rollout_plan(result)
    if lines is not None:
        doc["rollout_plan"] = lines
        print("\n".join(lines))
    _write(args, doc, junit(result, args.playbook))
    print("\npdctl run %s: %s (exit %d) in %.0fs; artifacts %s" % (args.playbook, doc["outcome"], code,
                                                                  doc["wall_s"], result.artifact_dir), file=sys.stderr)
    for f in doc["failed_tasks"]:
        print("  %s | %s | %s: %s" % (f["host"], f["play"], f["task"], f["msg"]), file=sys.stderr)
    for line in doc["quarantined"]:
        print("  %s" % line, file=sys.stderr)
    return code


def _print_plan(args) -> int:
    """--plan KIND: the rollout's steps for the inventory's plan, as if every instance (or host) had the change,
    estimated with its timing model (pdctl_rollout_timing), with what the front door admits at each; nothing
    runs."""
    plan = inventory.plan(args.inventory, extra_vars=args.extra_vars)
    if len(plan["cells"]) > 1:
        # The playbooks refuse such an inventory (preflight, 0021-cells.yml): a plan of what they do not do would lie.
        print("pdctl: %s plans %d cells (%s): rollouts by cell are not built yet, so there is no plan to print; "
              "`pdctl plan` shows the cells (docs/cells.md)" % (args.inventory, len(plan["cells"]),
                                                                ", ".join(c["name"] for c in plan["cells"])),
              file=sys.stderr)
        return EXIT_INVALID
    found_vars = inventory.load(args.inventory, names=PLAN_PRINT_VARS, extra_vars=args.extra_vars)
    # The front door's limits as its hosts see them (frontdoor_max_queue may be set for them alone).
    timing = found_vars.get(plan["frontdoor"]["hosts"][0], next(iter(found_vars.values())))["vars"]
    kwargs, kind = {}, args.plan
    try:
        kwargs["admission"] = admission.share(plan["frontdoor"], timing["pdctl_frontdoor_max_inflight"],
                                              timing.get("frontdoor_max_queue"))
    except (KeyError, admission.AdmissionError) as exc:
        print("pdctl: the front door's limits: %s" % exc, file=sys.stderr)
        return EXIT_INVALID
    if args.plan in ("prefill", "decode"):
        kwargs["keep"] = timing.get("pdctl_rollout_prefill_keep", 1)
    if args.plan == "decode":
        kind, kwargs["pending"] = "prefill", [i["name"] for i in plan["instances"] if i["pool"] == "decode"]
    if args.plan == "maintenance":
        # Router and front-door hosts reload the driver module instead of rebooting (maintenance_host.yml).
        kwargs["reload_hosts"] = [r["host"] for r in plan["routers"]] + list(plan["frontdoor"]["hosts"])
    try:
        found = rollout_filter.rollout_plan(plan, kind, timing.get("pdctl_rollout_timing"), **kwargs)
    except Exception as exc:  # the filter's AnsibleFilterError: a bad timing model
        print("pdctl: %s" % exc, file=sys.stderr)
        return EXIT_INVALID
    print("\n".join(found["lines"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"inventory": str(args.inventory), "kind": args.plan, "steps": found["steps"],
                                         "summary": found["summary"]}, indent=2) + "\n")
    return EXIT_OK


def _rejected_junit(playbook, problems):
    suites = ET.Element("testsuites", name="pdctl run %s" % playbook)
    suite = ET.SubElement(suites, "testsuite", name="inventory", tests="1", failures="1")
    case = ET.SubElement(suite, "testcase", classname="inventory", name="plan")
    node = ET.SubElement(case, "failure", message="inventory rejected: %s" % "; ".join(problems)[:1000],
                         type="invalid")
    node.text = "\n".join(problems)
    return ET.ElementTree(suites)


def _write(args, doc, tree):
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    if args.junit:
        args.junit.parent.mkdir(parents=True, exist_ok=True)
        tree.write(args.junit, encoding="unicode", xml_declaration=True)
