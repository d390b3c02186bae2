"""Issue 16, acceptance 3: site.yml with pdctl_min_prefill_instances and a prefill host with a missing GPU
(the lab's hardware fault, as tests/integration/test_host_stack.py injects it). With the minimum at 2 the
host is quarantined and reported, every router serves without its instances, and the gates pass at
reduced capacity; at 4 the run fails naming the host. The fault is then cleared and the lab re-converged.

Every run is site.yml limited by tags to the plays the quarantine touches (a whole site.yml costs this
phase too much), on a lab converged by the session's first run:
- the fault: the emulated hardware (the fault goes in: the bench's `pdctl-lab hardware`, the fixture), then
  FAULT_TAGS - the host stack's post-checks and the quarantine play (tag verify: the checks fail, the rescue records the host, the play takes it out), the
  serving instances (the quarantined host sits the vllm play out, the others are unchanged), the router
  (its membership), the front door (unchanged, but its play waits until a router is up behind it: the
  router just restarted and the gates measure through the front door) and the gates (they measure: the
  router changed);
- idempotence at reduced capacity: the checks and the router (the fault stays on the host until cleared);
- the minimum at 4: the checks only (the run stops at the quarantine play);
- the restore (fixture): the emulated hardware without the fault (`pdctl-lab hardware`), then the checks
  (nothing quarantined), the instances (started and enabled again), the router (all four prefill instances) and the front door
  (serving again before the next test), on FAULTY and the router's host only: the other prefill host's
  units hold only its own instances, so nothing there changed. Not the gates: their verdict would be on
  processes that the next gated run measures again anyway (the fingerprint holds the instances' and the
  router's processes).
Skipped throughout: host_base, firewall, model_weights, kv_path, monitoring (nothing there depends on the
quarantine, or the lab keeps what the first converge put there: monitoring's targets)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import LAB_ENV
from inventories import ROOT, inventory_variant
from pdctl import runner
from pdctl.lab import hardware
from test_serving import INSTANCES, on_host

pytestmark = [pytest.mark.lab, pytest.mark.slow]

FAULTY = "lab-prefill-1"  # prefill-2 and prefill-3; lab-prefill-0 keeps prefill-0 and prefill-1
FAULTY_ADDRESS, HEALTHY_ADDRESS = "10.89.64.12", "10.89.64.11"
ROUTER = "lab-decode-0"
CHECK = "Host sees every GPU at the manifest driver version"
MISSING = "GPU slot 5 (00000000:BB:00.0) missing"
VERDICT = ROOT / "artifacts" / "quarantine" / "last.json"
GATES_VERDICT_TASK = "Both gates passed"
# The plays each run needs (site.yml's play and role tags; host_stack.yml's quarantine play is tagged
# verify, its rescue and fact gathering always; preflight is always).
FAULT_TAGS = "verify,vllm,router,frontdoor,gates"
AGAIN_TAGS = "verify,router"
MINIMUM_TAGS = "verify"
RESTORE_TAGS = "verify,vllm,router,frontdoor"
RESTORE_LIMIT = "%s,%s" % (FAULTY, ROUTER)  # the router's host is the front door's too (inventories/lab)


def with_minimum(minimum):
    return ["-e", "pdctl_min_prefill_instances=%d" % minimum]  # as an operator types it


def router_prefills():
    """The prefill upstreams of the router's unit (vllm-router renames its process, so its cmdline is no
    use; the unit restarts whenever its argv changes)."""
    argv = on_host(ROUTER, "systemctl", "show", "-p", "ExecStart", "--value", "pdctl-router.service").split()
    return [argv[i + 1] for i, word in enumerate(argv) if word == "--prefill"]


def unit_states(host):
    out = {}
    for name in INSTANCES[host]:
        text = on_host(host, "systemctl", "show", "-p", "ActiveState", "-p", "UnitFileState",
                       "pdctl-vllm-%s.service" % name)
        out[name] = dict(line.split("=", 1) for line in text.split())
    return out


@pytest.fixture
def missing_gpu(converged_lab, lab, tmp_path):
    """The lab inventory with GPU slot 5 of FAULTY missing; afterwards the fault is cleared and site.yml
    re-converges what the test changed (the instances started again, every router with all four prefill
    instances, the checks' verdict without quarantine). The bench writes the emulated hardware, fault and
    restore alike; site.yml only checks it."""
    inv = inventory_variant(tmp_path / "inv", {"host_vars/" + FAULTY: {
        "pdctl_lab_hw_profile": {"faults": {"missing_gpus": [5]}}}})
    faulty = hardware.apply(inv, limit=FAULTY, envvars=LAB_ENV)
    assert faulty.ok, faulty.failures
    yield inv
    restored = hardware.apply(lab, limit=FAULTY, envvars=LAB_ENV)
    assert restored.ok, restored.failures
    result = runner.run_playbook("site.yml", lab, envvars=LAB_ENV, tags=RESTORE_TAGS, limit=RESTORE_LIMIT)
    assert result.ok, result.failures
    assert all(s == {"ActiveState": "active", "UnitFileState": "enabled"} for s in unit_states(FAULTY).values())
    assert len(router_prefills()) == 4
    assert json.loads(VERDICT.read_text())["quarantined"] == []


def test_prefill_host_with_a_missing_gpu_is_quarantined_while_the_minimum_holds(missing_gpu):
    result = runner.run_playbook("site.yml", missing_gpu, extra_args=with_minimum(2), envvars=LAB_ENV,
                                 tags=FAULT_TAGS)
    assert result.ok, (result.recap(), result.failures)
    # The check failed on FAULTY (and was rescued): nothing else failed anywhere.
    assert [(f["host"], f["task"]) for f in result.failures] == [(FAULTY, CHECK)], result.failures
    assert MISSING in str(result.failures[0]["msg"])
    assert result.total("failures") == 0 and (result.stats.get("rescued") or {}).get(FAULTY) == 1, result.recap()
    # Reported: in the run (the summary `pdctl run` prints), in its record, in the rollout report.
    report = "\n".join(result.quarantine)
    assert "2 of 4 prefill instances serve, pdctl_min_prefill_instances=2" in report, report
    assert "%s: %s: %s" % (FAULTY, CHECK, FAULTY) in report and MISSING in report, report
    verdict = json.loads(VERDICT.read_text())
    assert [(q["host"], q["instances"]) for q in verdict["quarantined"]] == [(FAULTY, INSTANCES[FAULTY])]
    rollout = subprocess.run([sys.executable, "-m", "pdctl.cli", "report", "-i", "inventories/lab"], cwd=ROOT,
                             env=dict(os.environ, **LAB_ENV), capture_output=True, text=True).stdout
    assert "QUARANTINED %s (prefill-2, prefill-3)" % FAULTY in rollout and MISSING in rollout, rollout
    # Out of service: every router without its instances, its instances stopped and disabled.
    prefills = router_prefills()
    assert len(prefills) == 2 and all(HEALTHY_ADDRESS in url for url in prefills), prefills
    assert not any(FAULTY_ADDRESS in url for url in prefills), prefills
    assert all(s == {"ActiveState": "inactive", "UnitFileState": "disabled"} for s in unit_states(FAULTY).values())
    # The gates measured the reduced deployment (the router changed) and passed.
    assert set(result.gates) == {"sla", "accuracy"}, "the gates reused a verdict of the whole deployment"
    assert all(g.get("passed") for g in result.gates.values()), result.gates
    (accepted,) = [str(r.get("msg")) for r in result.task_results(GATES_VERDICT_TASK).values()]
    assert "Rollout accepted: SLA and accuracy gates passed" in accepted, accepted
    assert "At reduced capacity, without the quarantined prefill hosts: %s (prefill-2, prefill-3)" % FAULTY in accepted, \
        accepted

    # Idempotent at reduced capacity: the checks quarantine it again (the fault is still in the host's
    # emulated hardware) and nothing changes, the router's membership included.
    again = runner.run_playbook("site.yml", missing_gpu, extra_args=with_minimum(2), envvars=LAB_ENV,
                                tags=AGAIN_TAGS)
    assert again.ok and again.total("changed") == 0, again.recap()
    assert [q["host"] for q in json.loads(VERDICT.read_text())["quarantined"]] == [FAULTY]

    # Above what remains: the run fails after the checks, naming the host and its failure.
    failed = runner.run_playbook("site.yml", missing_gpu, extra_args=with_minimum(4), envvars=LAB_ENV,
                                 tags=MINIMUM_TAGS)
    assert not failed.ok
    verdicts = [f for f in failed.failures
                if f["task"] == "Enough prefill instances remain to go on without the failed hosts"]
    assert verdicts, failed.failures
    message = str(verdicts[0]["msg"])
    assert "2 of 4 prefill instances would remain, fewer than pdctl_min_prefill_instances=4" in message, message
    assert "%s (%s: %s" % (FAULTY, CHECK, FAULTY) in message and MISSING in message, message
