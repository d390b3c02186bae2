"""site.yml on the lab hosts: converge, idempotence, truthful check mode, preflight rejections, and
`pdctl run` (JSON, JUnit, exit codes) from the installed collection."""
import os
import subprocess
import xml.etree.ElementTree as ET

import pytest
import yaml

from inventories import ROOT, inventory_variant
from malformed import CASES
from pdctl import runner

pytestmark = [pytest.mark.lab, pytest.mark.slow]

from conftest import LAB_ENV, pdctl_run  # noqa: E402

HOSTS = {"lab-prefill-0", "lab-prefill-1", "lab-decode-0"}


def test_converge_touches_every_host(converged_lab):
    assert set(converged_lab.stats["ok"]) == {"lab-prefill-0", "lab-prefill-1", "lab-decode-0"}
    assert converged_lab.total("failures") == 0 and converged_lab.total("dark") == 0


def test_second_run_changes_nothing(second_run):
    assert second_run.ok, second_run.failures
    assert second_run.total("changed") == 0, "not idempotent:\n" + second_run.recap()


def test_pdctl_run_writes_a_junit_case_per_play_and_host(second_run):
    """The second run went through `pdctl run` with a playbook outside the repository that uses the
    installed collection (its site playbook, a role and a module by FQCN)."""
    assert second_run.rc == 0 and second_run.doc["outcome"] == "accepted", second_run.recap()
    assert set(second_run.doc["hosts"]) == HOSTS
    cases = [(c.get("classname"), c.get("name")) for c in ET.parse(second_run.junit_path).getroot().iter("testcase")]
    assert len(cases) == len(set(cases)), "one case per play and host"
    plays = {play for play, _ in cases}
    assert "The collection's roles and modules in a play of our own" in plays
    assert {host for play, host in cases if play.startswith("Preflight")} == HOSTS
    assert not [c for c in ET.parse(second_run.junit_path).getroot().iter("failure")]
    assert second_run.artifact_dir.is_dir() and list(second_run.artifact_dir.glob("job_events/*.json"))


def test_pdctl_run_names_a_failing_gate_with_exit_3(converged_lab, lab, tmp_path):
    """A TPOT limit no deployment meets: the SLA gate fails, exit 3, named in the JSON and the JUnit."""
    sla = yaml.safe_load((ROOT / "inventories/lab/group_vars/all/gates.yml").read_text())["pdctl_gate_sla"]
    inv = inventory_variant(tmp_path / "inv", {"group_vars/all": {"pdctl_gate_sla": dict(sla, max_tpot_ms=0.5)}})
    run = pdctl_run(tmp_path, "site.yml", inv, "--tags", "gates")
    assert run.rc == 3, run.recap()
    assert run.doc["outcome"] == "gate failed" and run.doc["failed_gates"] == ["sla"]
    assert any("mean TPOT" in f for f in run.doc["gates"]["sla"]["failures"]), run.doc["gates"]
    assert run.doc["gates"]["accuracy"]["passed"] is True
    messages = [f.get("message") for f in ET.parse(run.junit_path).getroot().iter("failure")]
    assert len(messages) == 1 and messages[0].startswith("gate failed (sla)"), messages


# A name that another unit wants and no unit file provides: systemd holds it in memory (not-found,
# inactive) for as long as the wanting unit is loaded, as it holds for a while any name a task asked about.
GHOST_DROPIN = "/etc/systemd/system/multi-user.target.d/pdctl-test-ghost.conf"


def test_an_unchanged_deployment_reports_the_last_gate_verdict(converged_lab, lab):
    """A run that changed nothing the gates measure reports the last accepted verdict instead of measuring,
    even where systemd holds an inactive pdctl-* name in memory (it comes and goes as systemd collects it,
    so it must not count as a change of the deployment)."""
    first = runner.run_playbook("site.yml", lab, tags="gates", envvars=LAB_ENV)
    assert first.ok, first.failures
    host = "lab-decode-0"
    subprocess.run(["podman", "exec", host, "sh", "-c",
                    "mkdir -p %s && printf '[Unit]\\nWants=pdctl-test-ghost.service\\n' > %s && systemctl daemon-reload"
                    % (os.path.dirname(GHOST_DROPIN), GHOST_DROPIN)], check=True)
    try:
        listed = subprocess.run(["podman", "exec", host, "systemctl", "list-units", "--all", "--plain", "--no-legend",
                                 "pdctl-test-ghost.service"], capture_output=True, text=True, check=True).stdout
        assert "not-found" in listed, listed
        again = runner.run_playbook("site.yml", lab, tags="gates", envvars=LAB_ENV)
    finally:
        subprocess.run(["podman", "exec", host, "sh", "-c", "rm -f %s && systemctl daemon-reload" % GHOST_DROPIN],
                       check=True)
    assert again.ok, again.failures
    assert again.gates == {}, "measured again on an unchanged deployment: %s" % sorted(again.gates)
    (verdict,) = again.task_results("Both gates passed").values()
    assert "Rollout accepted on the last verdict" in verdict["msg"], verdict["msg"]


def test_check_diff_on_converged_lab_reports_nothing(check_run):
    assert check_run.ok, check_run.failures
    assert check_run.total("changed") == 0, check_run.recap()


# Every case goes through the planner in tests/unit/test_topology.py (`pdctl plan`, the same code
# preflight calls). Here one case per way a mistake reaches the planner through Ansible's own
# inventory: a GPU mask, a port, the group structure (two pools, a group the planner does not know,
# two routers), the versions manifest, a pool's settings.
THROUGH_ANSIBLE = ("gpu-overlap", "port-not-a-number", "host-in-two-pools", "host-in-unknown-group", "no-router",
                   "different-vllm-versions", "pool-key-nobody-reads")
LAB_CASES = [c for c in CASES if c[0] in THROUGH_ANSIBLE]


def test_every_lab_case_exists():
    assert {c[0] for c in LAB_CASES} == set(THROUGH_ANSIBLE)


@pytest.mark.parametrize("case,overrides,expected", LAB_CASES, ids=[c[0] for c in LAB_CASES])
def test_malformed_inventory_stops_in_preflight(lab, tmp_path, case, overrides, expected):
    inv = inventory_variant(tmp_path / "inv", overrides)
    result = runner.run_playbook("site.yml", inv, envvars=LAB_ENV)
    assert not result.ok
    assert result.total("changed") == 0
    assert [f["task"] for f in result.failures] == ["Inventory describes a valid P/D deployment"]
    message = str(result.failures[0]["msg"])
    assert "nothing was changed" in message
    for words in expected:
        assert words in message


@pytest.mark.parametrize("overrides,task,words", [
    ({"group_vars/all": {"pdctl_model_size_gb": 100000}}, "Model filesystem has room for the model",
     ["GB free on /mnt/model", "needs 100000 GB + 10% margin = 110000.0 GB"]),
    ({"group_vars/all": {"pdctl_supported_os": [{"distribution": "Ubuntu", "version": "24.04"}]}},
     "Operating system is supported", ["runs Debian 12", "supported: Ubuntu 24.04"]),
    ({"group_vars/all": {"pdctl_min_memory_gb": 100000}}, "Host has enough CPUs and memory",
     ["needs >= 1 CPUs and >= 100000 GiB"]),
], ids=["disk", "os", "memory"])
def test_unfit_host_fails_before_any_change(lab, tmp_path, overrides, task, words):
    inv = inventory_variant(tmp_path / "inv", overrides)
    result = runner.run_playbook("site.yml", inv, envvars=LAB_ENV)
    assert not result.ok
    assert result.total("changed") == 0
    assert {f["task"] for f in result.failures} == {task}
    assert {f["host"] for f in result.failures} == {"lab-prefill-0", "lab-prefill-1", "lab-decode-0"}
    for f in result.failures:
        assert f["host"] in f["msg"]
        for w in words:
            assert w in f["msg"]
