"""Host maintenance (playbooks/maintenance.yml, issue 16) on the lab, one host (--limit), for real.

The manifest's driver release goes to the lab's rehearsal release on lab-prefill-1, whose emulated GPUs
come back from it with an NVLink down: the host reboots onto the new module, fails its checks, and
stays out of service (instances stopped and disabled, the router without them, the front door serving
on the other host's), and the run fails naming it. Then the manifest's own release on the same host: it
reboots back, passes, and serves again with the router's whole membership; a last run has nothing to do.
The whole fleet's upgrade under load, the decode host's turn (temporary decode, module reload) and the
time per host are benchmarks/upgrade.py --scenario driver / driver-link-down (minutes each)."""
import json

import httpx
import pytest
import yaml

from conftest import LAB_ENV
from inventories import ROOT, inventory_variant
from pdctl import runner
from pdctl.lab import hardware
from test_quarantine_lab import ROUTER, router_prefills, unit_states
from test_serving import CA, FRONTDOOR, client_key, main_pids, on_host
from test_upgrade_lab import plain_output

pytestmark = [pytest.mark.lab, pytest.mark.slow]

HOST = "lab-prefill-1"  # prefill-2 and prefill-3
OTHER = "lab-prefill-0"
PLAYBOOK = "playbooks/maintenance.yml"
REPORT = ROOT / "artifacts" / "maintenance" / "last.json"
HW_CHECK = "GPUs, NVLinks, fabric and versions match the expected hardware"
STOPPED = "The host failed its checks and stays out of service; the run stops before the next host"
MANIFEST = yaml.safe_load((ROOT / "inventories/b300/group_vars/all/versions.yml").read_text())["pdctl_versions"]
NEW = yaml.safe_load((ROOT / "inventories/lab/group_vars/all/lab_hardware.yml").read_text())[
    "pdctl_lab_driver_rehearsal_versions"][0]


def loaded_module(host):
    return on_host(host, "cat", "/run/pdctl-lab/sys/module/nvidia/version").strip()


def one_request():
    resp = httpx.post(FRONTDOOR + "/v1/chat/completions", verify=CA, timeout=60,
                      headers={"Authorization": "Bearer " + client_key()},
                      json={"model": "/mnt/model/glm/GLM-5.2-NVFP4", "max_tokens": 4,
                            "messages": [{"role": "user", "content": "pdctl maintenance test"}]})
    return resp.status_code


def new_driver(tmp_path, **overrides):
    versions = dict(MANIFEST, nvidia_driver=NEW, nvidia_fabricmanager=NEW, libnvidia_nscq=NEW)
    return inventory_variant(tmp_path / "inv", {"group_vars/all": {"pdctl_versions": versions}, **overrides})


def test_site_yml_refuses_a_driver_change_on_hosts_that_serve(converged_lab, tmp_path):
    """Changing the driver release needs a reboot: site.yml does not do it under serving instances."""
    result = runner.run_playbook("site.yml", new_driver(tmp_path), envvars=LAB_ENV, tags="nvidia_driver")
    assert not result.ok
    failed = {f["host"]: " ".join(f["msg"].split()) for f in result.failures
              if f["task"] == "A serving host keeps its driver release (a change goes through host maintenance)"}
    assert set(failed) == {"lab-prefill-0", "lab-prefill-1", "lab-decode-0"}, result.failures
    assert "on NVIDIA driver %s; the manifest has %s" % (MANIFEST["nvidia_driver"], NEW) in failed[HOST]
    assert "Run `pdctl maintain`" in failed[HOST] and "Nothing was installed." in failed[HOST]
    assert result.total("changed") == 0
    assert on_host(HOST, "dpkg-query", "-W", "-f", "${Version}", "nvidia-smi") == MANIFEST["nvidia_driver"] + "-1"


@pytest.fixture
def new_driver_with_a_link_down(converged_lab, tmp_path, request):
    """The lab inventory with the rehearsal driver release in the manifest, and HOST's GPUs reporting
    NVLink 7 of GPU 2 down under that release only: written into HOST's emulated hardware by the bench
    (`pdctl-lab hardware`) before the run, since maintenance.yml never writes it; the fault waits for the
    release's module, which only the turn's reboot loads. Afterwards the inventory's own profile again."""
    inv = new_driver(tmp_path, **{"host_vars/" + HOST: {"pdctl_lab_hw_profile": {
        "faults": {}, "faults_by_driver": {NEW: {"links_down": [{"gpu": 2, "link": 7}]}}}}})
    faulty = hardware.apply(inv, limit=HOST, envvars=LAB_ENV)
    assert faulty.ok, faulty.failures
    yield inv
    if not getattr(request.node, "call_passed", False):
        # Whatever the failed test left: the manifest's release on HOST, serving (under the release's own
        # module the fault is inert, so this runs before the profile is put back, as the test's own run does).
        result = runner.run_playbook(PLAYBOOK, ROOT / "inventories/lab", envvars=LAB_ENV, limit=HOST)
        assert result.ok, result.failures
    restored = hardware.apply(ROOT / "inventories/lab", limit=HOST, envvars=LAB_ENV)
    assert restored.ok, restored.failures


def test_a_driver_change_in_check_mode_plans_the_turn_and_changes_nothing(converged_lab, tmp_path):
    """CI's short version of the next test (benchmarks/upgrade.py --scenario driver-link-down runs it in full,
    under load, with --scenario driver and kernel for every host's turn): `pdctl maintain --check` of a new
    driver on HOST prints its turn with the capacity at each step, and nothing changes on the host."""
    before = main_pids()
    result = runner.run_playbook(PLAYBOOK, new_driver(tmp_path), envvars=LAB_ENV, limit=HOST, check=True)
    assert result.ok, result.failures
    out = plain_output(result)
    assert "Maintenance plan" in out and "1 host(s) to take in turn: %s" % HOST in out, out[-2000:]
    assert "[prefill 2/4, decode GPUs 8/8" in out, out[-2000:]
    assert loaded_module(HOST) == MANIFEST["nvidia_driver"]
    assert on_host(HOST, "dpkg-query", "-W", "-f", "${Version}", "nvidia-smi") == MANIFEST["nvidia_driver"] + "-1"
    assert main_pids() == before
    assert all(s == {"ActiveState": "active", "UnitFileState": "enabled"} for s in unit_states(HOST).values())


@pytest.mark.long  # benchmarks/upgrade.py --scenario driver-link-down
def test_a_host_failing_its_checks_after_the_driver_upgrade_stays_out_until_it_passes(new_driver_with_a_link_down):
    assert loaded_module(HOST) == MANIFEST["nvidia_driver"]
    result = runner.run_playbook(PLAYBOOK, new_driver_with_a_link_down, envvars=LAB_ENV, limit=HOST)

    # Rebooted onto the new module, failed the NVLink check, out of service, the run stopped naming it.
    assert not result.ok
    # The hardware check's failure (rescued), then the stop that names the host.
    assert [f["task"] for f in result.failures] == [HW_CHECK, STOPPED], result.failures
    msg = " ".join(result.failures[-1]["msg"].split())
    assert msg.startswith(HOST + " is out of service: ") and "GPU 2" in msg and "link 7" in msg, msg
    assert "Its instances (prefill-2, prefill-3) stay stopped" in msg, msg
    assert loaded_module(HOST) == NEW and loaded_module(OTHER) == MANIFEST["nvidia_driver"]
    assert all(s == {"ActiveState": "inactive", "UnitFileState": "disabled"} for s in unit_states(HOST).values())
    assert sorted(router_prefills()) == ["http://10.89.64.11:8100", "http://10.89.64.11:8101"]
    assert one_request() == 200  # the front door serves on the other host's instances
    turn = json.loads(REPORT.read_text())["turns"][HOST]
    assert turn["passed"] is False and turn["activation"] == "reboot"
    assert "link 7" in turn["failure"]["reason"]

    # The manifest's own release: back onto its module, passes, serves again; then nothing left to do.
    result = runner.run_playbook(PLAYBOOK, ROOT / "inventories/lab", envvars=LAB_ENV, limit=HOST)
    assert result.ok, result.failures
    assert loaded_module(HOST) == MANIFEST["nvidia_driver"]
    assert all(s == {"ActiveState": "active", "UnitFileState": "enabled"} for s in unit_states(HOST).values())
    assert len(router_prefills()) == 4
    assert json.loads(REPORT.read_text())["turns"][HOST]["passed"] is True
    assert one_request() == 200
    again = runner.run_playbook(PLAYBOOK, ROOT / "inventories/lab", envvars=LAB_ENV)
    assert again.ok and again.total("changed") == 0, again.failures
    assert "Nothing to do: every host runs NVIDIA driver %s" % MANIFEST["nvidia_driver"] in (
        again.artifact_dir / "stdout").read_text()
