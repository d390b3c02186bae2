"""The rolling playbooks' steps as roles (issue 36): roles/upgrade and roles/maintenance, and the vllm role's
start_instance. Their entry points against their task files and argument specs, and a few steps offline on the
controller (the lab runs the rest: tests/integration/test_upgrade_lab.py, test_maintenance_lab.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from inventories import ROOT

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
# Task files a step includes itself, no entry point of their own.
INTERNAL = {"upgrade": {"release_host"}, "maintenance": {"reboot", "record"}}


def _specs(role):
    return yaml.safe_load((ROOT / "roles" / role / "meta/argument_specs.yml").read_text())["argument_specs"]


@pytest.mark.parametrize("role", sorted(INTERNAL))
def test_every_step_is_an_entry_point_with_its_task_file_and_main_names_them(role):
    specs = _specs(role)
    files = {p.stem for p in (ROOT / "roles" / role / "tasks").glob("*.yml")}
    assert set(specs) == files - INTERNAL[role]
    steps = specs["main"]["options"]["%s_step" % role]["choices"]
    assert set(steps) == set(specs) - {"main"}
    main = yaml.safe_load((ROOT / "roles" / role / "tasks/main.yml").read_text())
    assert main[0]["vars"]["_%s_steps" % role] == steps
    # Every option the role reads has the role's prefix.
    assert all(o.startswith(role + "_") for spec in specs.values() for o in spec.get("options") or {})


def test_vllm_start_instance_is_an_entry_point_with_prefixed_options():
    spec = _specs("vllm")["start_instance"]
    assert (ROOT / "roles/vllm/tasks/start_instance.yml").is_file()
    assert spec["options"]["vllm_start_instance"]["required"] and all(o.startswith("vllm_") for o in spec["options"])


def test_the_kill_points_task_names_stay_in_the_steps():
    # benchmarks/upgrade.py and the lab tests kill at these headers (with the role's prefix, or without).
    text = {p: p.read_text() for p in (ROOT / "roles").glob("*/tasks/*.yml")}
    for name, where in [("Instance runs its unit: {{ vllm_start_instance.name }}", "vllm/tasks/start_instance.yml"),
                        ("The router pairs only the new release", "upgrade/tasks/release.yml"),
                        ("Release switch record: {{ upgrade_journal_state }}", "upgrade/tasks/journal.yml"),
                        ("Prefill change record: {{ upgrade_rollout_state }}", "upgrade/tasks/prefill_record.yml"),
                        ("Keepalived stops here", "maintenance/tasks/reboot.yml")]:
        assert name in text[ROOT / "roles" / where], name


def _run(tmp_path, role, tasks_from, extravars, after=(), before=()):
    include = {"name": "pdctl.vllm_pd." + role, **({"tasks_from": tasks_from} if tasks_from else {})}
    play = [{"name": role, "hosts": "serving", "connection": "local", "gather_facts": False,
             "vars": {"ansible_python_interpreter": sys.executable},
             "tasks": list(before) + [{"name": "step under test", "ansible.builtin.include_role": include}] + list(after)}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"serving": {"hosts": {"localhost": {}}}}))
    (tmp_path / "vars.json").write_text(json.dumps(extravars))
    res = subprocess.run([ANSIBLE_PLAYBOOK, str(tmp_path / "play.yml"), "-i", str(tmp_path / "hosts.yml"),
                          "-e", "@%s" % (tmp_path / "vars.json")],
                         cwd=ROOT, capture_output=True, text=True,
                         env={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": "/usr/bin:/bin",
                              "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "HOME": str(tmp_path)})
    return res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("role", sorted(INTERNAL))
def test_a_role_without_a_step_names_them(tmp_path, role):
    ok, out = _run(tmp_path, role, None, {})
    assert not ok and "%s_step" % role in out


def test_start_instance_says_which_instance(tmp_path):
    ok, out = _run(tmp_path, "vllm", "start_instance", {"upgrade_canary_request": {}, "pdctl_api_key": "k"})
    assert not ok and "missing required arguments: vllm_start_instance" in out


def test_the_journal_step_writes_the_record_and_keeps_it_in_the_runs_standing(tmp_path):
    record = tmp_path / "release-switch.json"
    run = {"journal": {}, "rolling_back": False, "reason": "", "target_release": "b", "rollout": {},
           "rollout_rollback": False, "rollout_requested": False}
    after = [{"name": "standing", "ansible.builtin.copy": {"content": "{{ upgrade_run | to_json }}",
                                                           "dest": str(tmp_path / "run.json"), "mode": "0644"}}]
    # A fact, as upgrade.yml sets it (an extra var would outrank the step's set_fact).
    before = [{"name": "the run's standing", "ansible.builtin.set_fact": {"upgrade_run": run}}]
    ok, out = _run(tmp_path, "upgrade", "journal", {"upgrade_journal_file": str(record), "upgrade_journal_state": "switching",
                                                    "upgrade_journal_update": {"from": "a", "to": "b"},
                                                    "ansible_become": False}, after, before)
    assert ok, out
    written = json.loads(record.read_text())
    assert {k: written[k] for k in ("from", "to", "state", "reason")} == {"from": "a", "to": "b", "state": "switching",
                                                                          "reason": ""}
    assert json.loads((tmp_path / "run.json").read_text())["journal"] == written


def test_the_journal_step_takes_only_a_known_state(tmp_path):
    ok, out = _run(tmp_path, "upgrade", "journal", {"upgrade_journal_state": "half-done"})
    assert not ok and "upgrade_journal_state must be one of" in out


def test_the_read_step_reads_only_the_records_named(tmp_path):
    rollout = {"state": "accepted", "target": "cfg", "previous": None}
    (tmp_path / "rollout.json").write_text(json.dumps(rollout))
    (tmp_path / "turn.json").write_text(json.dumps({"host": "localhost", "lender": "prefill-3"}))
    after = [{"name": "what was read", "ansible.builtin.copy": {
        "content": "{{ {'own': upgrade_rollout_own, 'journal': upgrade_journal_read.content is defined,"
                   " 'turn': upgrade_turn_record.content is defined} | to_json }}",
        "dest": str(tmp_path / "read.json"), "mode": "0644"}}]
    ok, out = _run(tmp_path, "upgrade", "read", {"upgrade_read": ["journal", "rollout"], "ansible_become": False,
                                                 "upgrade_journal_file": str(tmp_path / "none.json"),
                                                 "upgrade_rollout_file": str(tmp_path / "rollout.json"),
                                                 "maintenance_turn_file": str(tmp_path / "turn.json")}, after)
    assert ok, out
    # No switch recorded here: nothing read, no failure; the turn is not asked for.
    assert json.loads((tmp_path / "read.json").read_text()) == {"own": rollout, "journal": False, "turn": False}
