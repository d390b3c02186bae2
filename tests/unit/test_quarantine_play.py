"""Quarantine (pdctl_min_prefill_instances) through the real plays, without hosts: host_stack.yml's rescue
and its quarantine play run on the lab inventory over a local connection, with the host stack itself
replaced by one check that fails on the hosts a test names. (The lab test with a missing GPU:
tests/integration/test_quarantine_lab.py.)"""
import json
import os
import subprocess
import sys

import pytest
import yaml

from inventories import ROOT

ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
LOCAL = {"ansible_connection": "local", "ansible_become": False,
         "ansible_python_interpreter": "{{ ansible_playbook_python }}"}
CHECK = "Host sees every GPU at the manifest driver version"


def playbook(tmp_path):
    """host_stack.yml's two plays, local, its block one failing check; then the plan as later plays see it."""
    host_stack, verdict = yaml.safe_load((ROOT / "playbooks/host_stack.yml").read_text())
    plan = {"name": "Plan", "hosts": "serving:router", "gather_facts": False, "vars": LOCAL,
            "tasks": [{"name": "Compute the plan", "ansible.builtin.include_role": {
                "name": "pdctl.vllm_pd.preflight", "tasks_from": "0020-plan.yml"}}]}
    block = next(t for t in host_stack["tasks"] if "block" in t)
    block["block"] = [{"name": CHECK, "ansible.builtin.assert": {
        "that": "inventory_hostname not in failing_hosts",
        "fail_msg": "{{ inventory_hostname }}: 7 GPUs at driver 580.95.05, expected 8 GPUs at driver 580.95.05. "
                    "GPU slot 5 (00000000:BB:00.0) missing;"}}]
    host_stack.pop("pre_tasks")
    for play in (host_stack, verdict):
        play["vars"] = dict(play.get("vars") or {}, **LOCAL)
    seen = {"name": "What later plays see", "hosts": "serving:router", "gather_facts": False, "vars": LOCAL,
            "tasks": [{"name": "Write the plan", "ansible.builtin.copy": {
                "content": "{{ preflight_plan | to_json }}", "dest": str(tmp_path / "plan-{{ inventory_hostname }}.json"),
                "mode": "0644"}}]}
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump([plan, host_stack, verdict, seen], sort_keys=False))
    return path


def run(tmp_path, failing, minimum=None):
    extra = {"failing_hosts": failing, "pdctl_artifacts_dir": str(tmp_path / "artifacts")}
    argv = [ANSIBLE_PLAYBOOK, "-i", str(ROOT / "inventories/lab"), str(playbook(tmp_path)), "-e", json.dumps(extra)]
    if minimum is not None:
        argv += ["-e", "pdctl_min_prefill_instances=%s" % minimum]  # a string, as an operator types it
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STRATEGY="linear",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_CALLBACK_RESULT_FORMAT="json", PDCTL_LAB_DIR=str(tmp_path))
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env)


def seen_plan(tmp_path, host):
    return json.loads((tmp_path / ("plan-%s.json" % host)).read_text())


def test_failed_prefill_host_is_quarantined_and_the_run_goes_on(tmp_path):
    res = run(tmp_path, ["lab-prefill-1"], minimum=2)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for host in ("lab-prefill-0", "lab-prefill-1", "lab-decode-0"):
        plan = seen_plan(tmp_path, host)
        assert [i["name"] for i in plan["instances"]] == ["decode-0", "prefill-0", "prefill-1"], host
        assert [u.rsplit(":", 2)[-2].strip("/") for u in plan["router"]["prefill_urls"]] == ["10.89.64.11"] * 2
        assert plan["routers"][0]["prefill_urls"] == plan["router"]["prefill_urls"]
        (q,) = plan["quarantined"]
        assert q["host"] == "lab-prefill-1" and q["instances"] == ["prefill-2", "prefill-3"]
        assert q["units"] == ["pdctl-vllm-prefill-2.service", "pdctl-vllm-prefill-3.service"]
        assert q["failures"] == [{"task": CHECK, "msg": "lab-prefill-1: 7 GPUs at driver 580.95.05, expected 8 GPUs "
                                  "at driver 580.95.05. GPU slot 5 (00000000:BB:00.0) missing;"}]
    assert "2 of 4 prefill instances serve, pdctl_min_prefill_instances=2" in out
    assert "lab-prefill-1: %s: lab-prefill-1: 7 GPUs" % CHECK in out
    verdict = json.loads((tmp_path / "artifacts/quarantine/last.json").read_text())
    assert verdict["min_prefill_instances"] == "2" and [q["host"] for q in verdict["quarantined"]] == ["lab-prefill-1"]


def test_too_few_prefill_instances_left_fails_naming_the_host(tmp_path):
    res = run(tmp_path, ["lab-prefill-1"], minimum=4)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "Enough prefill instances remain" in out
    assert "2 of 4 prefill instances would remain, fewer than pdctl_min_prefill_instances=4" in out
    assert "lab-prefill-1 (%s: lab-prefill-1: 7 GPUs" % CHECK in out
    assert not (tmp_path / "plan-lab-decode-0.json").exists(), "a later play ran"


def test_without_the_minimum_a_failed_host_fails_as_before(tmp_path):
    res = run(tmp_path, ["lab-prefill-1"])
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "fatal: [lab-prefill-1]" in out and "GPU slot 5 (00000000:BB:00.0) missing" in out
    # The other hosts go on with the whole plan (as when a host fails any play); nothing is quarantined.
    assert seen_plan(tmp_path, "lab-decode-0")["quarantined"] == []
    assert not (tmp_path / "plan-lab-prefill-1.json").exists()
    assert json.loads((tmp_path / "artifacts/quarantine/last.json").read_text())["quarantined"] == []


@pytest.mark.parametrize("failing", [["lab-decode-0"], ["lab-decode-0", "lab-prefill-1"]])
def test_a_failed_decode_or_router_host_is_never_quarantined(tmp_path, failing):
    res = run(tmp_path, failing, minimum=1)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "fatal: [lab-decode-0]" in out
    assert not (tmp_path / "plan-lab-decode-0.json").exists()


def gates_verdict(tmp_path, passed, quarantined):
    """gates.yml's verdict and its assert, local, on given gate results and a plan with `quarantined`."""
    gates = yaml.safe_load((ROOT / "playbooks/gates.yml").read_text())[1]
    tasks = [t for t in gates["tasks"] if t["name"] in ("The verdict", "Both gates passed")]
    play = {"name": "Verdict", "hosts": "localhost", "gather_facts": False, "tasks": tasks,
            "vars": dict(LOCAL, gates_reuse=False, gates_report_dir="artifacts/gates/R",
                         gates_sla={"passed": passed}, gates_accuracy={"passed": True, "msg": "ok"},
                         preflight_plan={"quarantined": quarantined})}
    path = tmp_path / "verdict.yml"
    path.write_text(yaml.safe_dump([play], sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STRATEGY="linear",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    res = subprocess.run([ANSIBLE_PLAYBOOK, "-i", "localhost,", str(path)], cwd=ROOT, capture_output=True,
                         text=True, env=env)
    return res.returncode, res.stdout + res.stderr


QUARANTINED = [{"host": "lab-prefill-1", "instances": ["prefill-2", "prefill-3"],
                "reason": "Host sees every GPU at the manifest driver version: GPU slot 5 missing"}]
REDUCED = ("At reduced capacity, without the quarantined prefill hosts: lab-prefill-1 (prefill-2, prefill-3) - "
           "Host sees every GPU at the manifest driver version: GPU slot 5 missing.")


def test_the_gates_verdict_says_it_was_measured_at_reduced_capacity(tmp_path):
    code, out = gates_verdict(tmp_path, True, QUARANTINED)
    assert code == 0, out
    assert "Rollout accepted: SLA and accuracy gates passed. Report: artifacts/gates/R " + REDUCED in out, out
    code, out = gates_verdict(tmp_path, False, QUARANTINED)
    assert code != 0, out
    assert "Rollout rejected. SLA: failed. Accuracy: passed. Report: artifacts/gates/R " + REDUCED in out, out


def test_the_gates_verdict_without_quarantine_is_unchanged(tmp_path):
    code, out = gates_verdict(tmp_path, True, [])
    assert code == 0 and '"msg": "Rollout accepted: SLA and accuracy gates passed. Report: artifacts/gates/R"' in out, out
    code, out = gates_verdict(tmp_path, False, [])
    assert code != 0 and '"msg": "Rollout rejected. SLA: failed. Accuracy: passed. Report: artifacts/gates/R"' in out, out
    assert "reduced capacity" not in out
