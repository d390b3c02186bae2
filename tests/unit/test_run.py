"""`pdctl run`: exit codes, the JSON summary and the JUnit file, from recorded outcomes (no hosts).
The lab tests run it for real (tests/integration/test_lab_site.py)."""
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

from inventories import MINIMAL, inventory_variant
from malformed import CASES

from pdctl import cli, run, runner

P0, D0 = "lab-prefill-0", "lab-decode-0"
VERDICT_TASK = "Both gates passed"  # playbooks/gates.yml; pdctl reads the verdict from its set_stats, not this name
REJECTED = {"pdctl_gates_verdict": {"passed": False, "enforced": True, "play": "Rollout gates"}}


def outcome(play, host, failure=None, **counts):
    out = {"play": play, "host": host, "ok": 3, "changed": 0, "failed": 0, "unreachable": 0, "skipped": 1,
           "failure": failure}
    out.update(counts)
    return out


def result(rc=0, failures=(), outcomes=(), gates=None, reported=None):
    return runner.PlaybookResult(rc=rc, status="successful" if rc == 0 else "failed", stats={},
                                 artifact_dir=Path("/tmp/a"), failures=list(failures), outcomes=list(outcomes),
                                 gates=gates or {}, reported=reported or {})


def failure(host, task, msg, play="p", unreachable=False):
    return {"host": host, "play": play, "task": task, "msg": msg, "unreachable": unreachable}


def test_exit_codes_tell_the_outcomes_apart():
    assert run.exit_code(result(0)) == 0
    assert run.exit_code(result(2, [failure(P0, run.PLAN_TASK, "bad")])) == 2
    assert run.exit_code(result(4, [failure(P0, "Gather", "ssh: no route", unreachable=True)])) == 4
    gate_failed = result(2, [failure(D0, VERDICT_TASK, "Rollout rejected")],
                         gates={"sla": {"passed": False, "failures": ["context 4096: mean TPOT 11 ms > 1 ms"]},
                                "accuracy": {"passed": True}}, reported=REJECTED)
    assert run.exit_code(gate_failed) == 3
    # The verdict alone (a rejection on the last measured verdict, no gate module ran) is a gate failure too.
    assert run.exit_code(result(2, [failure(D0, VERDICT_TASK, "Rollout rejected")], reported=REJECTED)) == 3
    assert run.exit_code(result(2, [failure(P0, "Instance units", "template error")])) == 1


def test_junit_has_one_case_per_play_and_host_and_names_the_failing_gate(tmp_path):
    f = failure(D0, VERDICT_TASK, "Rollout rejected. SLA: failed", play="Rollout gates")
    res = result(2, [f], [outcome("Preflight", P0), outcome("Preflight", D0), outcome("Rollout gates", D0, f, failed=1)],
                 gates={"sla": {"passed": False}, "accuracy": {"passed": True}}, reported=REJECTED)
    path = tmp_path / "j.xml"
    run.junit(res, "site.yml").write(path, encoding="unicode", xml_declaration=True)
    root = ET.parse(path).getroot()
    cases = [(c.get("classname"), c.get("name")) for c in root.iter("testcase")]
    assert cases == [("Preflight", P0), ("Preflight", D0), ("Rollout gates", D0)]
    failed = [c for c in root.iter("testcase") if c.find("failure") is not None]
    assert len(failed) == 1
    assert failed[0].find("failure").get("message").startswith("gate failed (sla): Both gates passed:")
    suites = {s.get("name"): s.get("failures") for s in root.iter("testsuite")}
    assert suites == {"Preflight": "0", "Rollout gates": "1"}


def test_json_summary_sums_hosts_and_lists_failed_tasks_and_gates():
    f = failure(D0, VERDICT_TASK, "Rollout rejected", play="Rollout gates")
    res = result(2, [f], [outcome("A", D0, changed=2), outcome("Rollout gates", D0, f, ok=1, failed=1)],
                 gates={"sla": {"passed": False, "failures": ["x"], "runs": [{"input_len": 1024}]},
                        "accuracy": {"passed": True, "benchmarks": {"aime": {"correct": 28}}}}, reported=REJECTED)
    doc = run.summary(res, "site.yml", "inventories/lab", 3, 12.3)
    assert doc["outcome"] == "gate failed" and doc["failed_gates"] == ["sla"]
    assert doc["hosts"][D0] == {"ok": 4, "changed": 2, "failed": 1, "unreachable": 0, "skipped": 2}
    assert doc["failed_tasks"] == [{"host": D0, "play": "Rollout gates", "task": VERDICT_TASK,
                                    "msg": "Rollout rejected"}]
    assert doc["gates"]["sla"]["runs"] == [{"input_len": 1024}] and doc["gates"]["accuracy"]["passed"]
    json.dumps(doc)  # serialisable as written


def test_malformed_inventory_exits_2_and_writes_both_files(tmp_path, capsys):
    name, overrides, words = next(c for c in CASES if c[0] == "host-in-two-pools")
    inv = inventory_variant(tmp_path / "inv", overrides)
    rc = cli.main(["run", "site.yml", "-i", str(inv), "--json", str(tmp_path / "s.json"),
                   "--junit", str(tmp_path / "j.xml")])
    assert rc == 2
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["exit_code"] == 2 and doc["outcome"] == "inventory rejected"
    assert any(all(w in p for w in words) for p in doc["problems"]), doc["problems"]
    case = ET.parse(tmp_path / "j.xml").getroot().find(".//testcase")
    assert "inventory rejected" in case.find("failure").get("message")
    assert "is invalid" in capsys.readouterr().err


def test_a_rolled_back_upgrade_exits_as_a_gate_failure():
    rolled_back = result(2, [failure(P0, run.UPGRADE_VERDICT_TASK, "Upgrade rolled back: the gates failed on B")],
                         gates={"sla": {"passed": True}, "accuracy": {"passed": True}})
    assert run.exit_code(rolled_back) == 3


def test_rollback_runs_the_upgrade_playbook_asking_for_the_rollback(tmp_path, monkeypatch):
    seen = {}

    def fake_run(playbook, inventory, **kw):
        seen.update(playbook=playbook, extra=kw["extra_args"], check=kw["check"])
        return result(0)

    monkeypatch.setattr(runner, "run_playbook", fake_run)
    inv = inventory_variant(tmp_path / "inv", {})
    rc = cli.main(["rollback", "-i", str(inv), "--check", "--json", str(tmp_path / "s.json"),
                   "--artifacts", str(tmp_path / "a")])
    assert rc == 0
    assert seen["playbook"] == "playbooks/upgrade.yml" and seen["check"] is True
    assert seen["extra"][:2] == ["-e", "upgrade_rollback=true"]
    rc = cli.main(["upgrade", "-i", str(inv), "--json", str(tmp_path / "s.json"), "--artifacts", str(tmp_path / "a")])
    assert rc == 0 and "upgrade_rollback=true" not in seen["extra"]


def test_maintain_runs_the_maintenance_playbook_on_the_hosts_asked_for(tmp_path, monkeypatch):
    seen = {}

    def fake_run(playbook, inventory, **kw):
        seen.update(playbook=playbook, limit=kw["limit"], check=kw["check"])
        return result(0)

    monkeypatch.setattr(runner, "run_playbook", fake_run)
    inv = inventory_variant(tmp_path / "inv", {})
    rc = cli.main(["maintain", "-i", str(inv), "--limit", "lab-prefill-1", "--check", "--json", str(tmp_path / "s.json"),
                   "--artifacts", str(tmp_path / "a")])
    assert rc == 0 and seen == {"playbook": "playbooks/maintenance.yml", "limit": "lab-prefill-1", "check": True}


def test_task_results_read_each_hosts_result_of_a_task_from_the_events(tmp_path):
    events = tmp_path / "job_events"
    events.mkdir()
    for i, (kind, host, task) in enumerate([("runner_on_ok", P0, "T"), ("runner_on_failed", D0, "T"),
                                            ("runner_on_skipped", "lab-prefill-1", "T"), ("runner_on_ok", P0, "U")]):
        (events / ("%d.json" % i)).write_text(json.dumps(
            {"event": kind, "event_data": {"task": task, "host": host, "res": {"msg": "%s on %s" % (task, host)}}}))
    res = runner.PlaybookResult(rc=2, status="failed", stats={}, artifact_dir=tmp_path)
    assert res.task_results("T") == {P0: {"msg": "T on %s" % P0}, D0: {"msg": "T on %s" % D0}}
    assert res.task_results("nothing") == {}


def real_run(tmp_path, playbook: str) -> runner.PlaybookResult:
    """`playbook` (YAML text, plays on localhost) run for real through ansible-runner, as `pdctl run` runs one."""
    book = tmp_path / "book.yml"
    book.write_text(playbook)
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    localhost: {ansible_connection: local}\n")
    return runner.run_playbook(str(book), inv, private_data_dir=str(tmp_path / "runner"))


def test_the_verdict_is_read_from_set_stats_whatever_the_task_is_called(tmp_path):
    """A real run through ansible-runner: a play reports a rejecting verdict with set_stats (as playbooks/gates.yml
    does) and then fails on a task of any name; pdctl reads the verdict, exits 3 and says so in the JUnit file."""
    res = real_run(tmp_path, """---
- name: Rollout gates
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Whatever the report is called
      ansible.builtin.set_stats:
        data: {pdctl_gates_verdict: {passed: false, enforced: true}}
        per_host: false
        aggregate: false
    - name: Whatever the verdict is called
      ansible.builtin.assert: {that: false, fail_msg: Rollout rejected}
""")
    assert res.reported == REJECTED
    assert run.exit_code(res) == 3
    (message,) = [c.find("failure").get("message") for c in run.junit(res, "verdict.yml").getroot().iter("testcase")
                  if c.find("failure") is not None]
    assert message.startswith("gate failed (?): Whatever the verdict is called: Rollout rejected"), message


UPGRADE_REJECTED = {"pdctl_upgrade": {"verdict": "rejected", "rolled_back": True, "passed": True, "kind": "release",
                                      "reason": "the gates failed on B: SLA", "target_release": "A",
                                      "play": "Upgrade verdict"}}


def test_an_upgrade_is_judged_by_its_report_not_by_task_names():
    """playbooks/upgrade.yml reports how it ended (set_stats pdctl_upgrade, upgrade_decide.outcome()): a rejected
    verdict exits 3 whatever its task is called; a run that reported another verdict and failed elsewhere exits 1."""
    assert run.exit_code(result(2, [failure(P0, "Whatever the verdict is called", "Upgrade rolled back")],
                                reported=UPGRADE_REJECTED)) == 3
    accepted = {"pdctl_upgrade": dict(UPGRADE_REJECTED["pdctl_upgrade"], verdict="accepted", rolled_back=False)}
    assert run.exit_code(result(2, [failure(P0, run.UPGRADE_VERDICT_TASK, "a template error")],
                                reported=accepted)) == 1
    # Check mode reports its verdict too: nothing was measured, nothing rejected.
    check = {"pdctl_upgrade": dict(accepted["pdctl_upgrade"], verdict="check")}
    assert run.exit_code(result(2, [failure(P0, "Instance units", "template error")], reported=check)) == 1


def test_the_summary_carries_the_upgrades_report():
    doc = run.summary(result(2, [], reported=UPGRADE_REJECTED), "playbooks/upgrade.yml", "inventories/lab", 3, 1.0)
    assert doc["upgrade"] == {k: v for k, v in UPGRADE_REJECTED["pdctl_upgrade"].items() if k != "play"}
    assert "upgrade" not in run.summary(result(0), "site.yml", "inventories/lab", 0, 1.0)


def test_what_set_stats_reported_is_read_from_the_runs_stats_first():
    """The playbook_on_stats event's artifact_data (what set_stats left, per_host: false) is the run's account;
    the set_stats task's own event says which play reported it."""
    rec = runner._Recorder()
    events = [
        {"event": "playbook_on_play_start", "event_data": {"play": "Upgrade verdict"}},
        {"event": "runner_on_ok", "event_data": {"host": P0, "task": "Report", "res": {"ansible_stats": {
            "data": {"pdctl_upgrade": {"verdict": "accepted"}}, "per_host": False, "aggregate": False}}}},
        {"event": "playbook_on_play_start", "event_data": {"play": "Later"}},
        {"event": "playbook_on_stats", "event_data": {"artifact_data": {
            "pdctl_upgrade": {"verdict": "rejected"}, "pdctl_gates_verdict": {"passed": False, "enforced": False},
            "not_ours": {"x": 1}, "pdctl_odd": "not a dict"}}},
    ]
    for event in events:
        assert rec(event) is True
    assert rec.reported == {"pdctl_upgrade": {"verdict": "rejected", "play": "Upgrade verdict"},
                            "pdctl_gates_verdict": {"passed": False, "enforced": False, "play": None}}
    # No stats event (a run cut short): what the set_stats task reported stands.
    rec = runner._Recorder()
    for event in events[:2]:
        rec(event)
    assert rec.reported == {"pdctl_upgrade": {"verdict": "accepted", "play": "Upgrade verdict"}}


def test_the_upgrades_verdict_is_read_from_set_stats_in_a_real_run(tmp_path):
    """Through ansible-runner, as upgrade.yml's last play reports it: the verdict, then an assert of any name."""
    res = real_run(tmp_path, """---
- name: Upgrade verdict
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Whatever the report is called
      ansible.builtin.set_stats:
        data: {pdctl_upgrade: {verdict: rejected, rolled_back: true, reason: the gates failed on B}}
        per_host: false
        aggregate: false
    - name: Whatever the verdict is called
      ansible.builtin.assert: {that: false, fail_msg: "Upgrade rolled back: the gates failed on B"}
""")
    assert res.reported == {"pdctl_upgrade": {"verdict": "rejected", "rolled_back": True,
                                              "reason": "the gates failed on B", "play": "Upgrade verdict"}}
    assert run.exit_code(res) == 3


PLAN_LINES = ["Rollout plan: 2 steps, about 4 min", "  1. prefill-0 (lab-prefill-0)", "  2. prefill-1 (lab-prefill-0)"]


def test_the_inventorys_verdict_is_read_from_preflights_report_not_the_task_name():
    """roles/preflight reports the plan's verdict (set_stats pdctl_plan) before its assert: a rejection exits 2 and
    the summary names the problems, whatever task failed; a plan reported ok is not a rejection, even where a task
    of the assert's name failed; a run that reported nothing falls back to that name."""
    rejected = {"pdctl_plan": {"ok": False, "problems": ["prefill-0: GPU 9 does not exist"], "play": "Preflight"}}
    res = result(2, [failure(P0, "Whatever the check is called", "The inventory is invalid")], reported=rejected)
    assert run.exit_code(res) == 2
    assert run.summary(res, "site.yml", "inventories/lab", 2, 1.0)["problems"] == ["prefill-0: GPU 9 does not exist"]
    ok = {"pdctl_plan": {"ok": True, "problems": [], "play": "Preflight"}}
    assert run.exit_code(result(2, [failure(P0, run.PLAN_TASK, "a template error")], reported=ok)) == 1
    assert "problems" not in run.summary(result(0, reported=ok), "site.yml", "inventories/lab", 0, 1.0)
    assert run.exit_code(result(2, [failure(P0, run.PLAN_TASK, "bad")])) == 2


def test_the_rollout_plan_is_read_from_its_report_then_from_the_task(tmp_path):
    res = result(0, reported={"pdctl_rollout_plan": PLAN_LINES})
    assert run.rollout_plan(res) == PLAN_LINES
    # No report (a playbook from before it): the lines the "Rollout plan" task printed.
    events = tmp_path / "job_events"
    events.mkdir()
    (events / "1.json").write_text(json.dumps({"event": "runner_on_ok", "event_data": {
        "task": run.ROLLOUT_PLAN_TASK, "host": P0, "res": {"msg": PLAN_LINES[:1]}}}))
    old = runner.PlaybookResult(rc=0, status="successful", stats={}, artifact_dir=tmp_path)
    assert run.rollout_plan(old) == PLAN_LINES[:1]
    assert run.rollout_plan(runner.PlaybookResult(rc=0, status="successful", stats={}, artifact_dir=tmp_path / "x")) is None


def test_the_plan_and_rollout_plan_reports_are_read_from_set_stats_in_a_real_run(tmp_path):
    """Through ansible-runner, as preflight and upgrade_pass.yml report them (the rollout plan a list of lines), then
    a failing assert of another name: pdctl reads both from the run's stats."""
    res = real_run(tmp_path, """---
- name: Preflight
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Whatever the rollout plan is called
      ansible.builtin.set_stats:
        data: {pdctl_rollout_plan: %s}
        per_host: false
        aggregate: false
    - name: Whatever the report is called
      ansible.builtin.set_stats:
        data: {pdctl_plan: {ok: false, problems: [prefill-0 has no GPU 9]}}
        per_host: false
        aggregate: false
    - name: Whatever the check is called
      ansible.builtin.assert: {that: false, fail_msg: The inventory is invalid}
""" % json.dumps(PLAN_LINES))
    assert res.reported == {"pdctl_plan": {"ok": False, "problems": ["prefill-0 has no GPU 9"], "play": "Preflight"},
                            "pdctl_rollout_plan": PLAN_LINES}
    assert run.exit_code(res) == 2
    assert run.rollout_plan(res) == PLAN_LINES


def test_the_inventory_check_sees_the_runs_extra_vars(tmp_path, monkeypatch):
    """A value the run gets with -e (here the front doors' address, which a site may keep outside its inventory)
    counts for the check before the run: without it the inventory is rejected, with it the playbook runs."""
    ran = []
    monkeypatch.setattr(runner, "run_playbook", lambda playbook, inventory, **kw: ran.append(kw["extra_args"])
                        or result(0))
    hosts = yaml.safe_load((MINIMAL / "hosts.yml").read_text())
    vip = hosts["all"].pop("vars")
    inv = tmp_path / "inv"
    shutil.copytree(MINIMAL, inv)
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (tmp_path / "vip.yml").write_text(yaml.safe_dump(vip))
    common = ["run", "site.yml", "-i", str(inv), "--json", str(tmp_path / "s.json"), "--artifacts", str(tmp_path / "a")]
    assert cli.main(common) == 2 and not ran
    assert "pdctl_frontdoor_vip" in " ".join(json.loads((tmp_path / "s.json").read_text())["problems"])
    assert cli.main(common + ["-e", "@%s" % (tmp_path / "vip.yml")]) == 0
    assert ran == [["-e", "@%s" % (tmp_path / "vip.yml")]]
    # The JSON form too.
    assert cli.main(common + ["-e", json.dumps(vip)]) == 0
