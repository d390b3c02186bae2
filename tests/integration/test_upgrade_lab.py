"""Rolling upgrade of a compatible change (issue 15, acceptance 1), on the lab under 8 streaming clients:
a flag of lab-prefill-1's prefill instances changes; playbooks/upgrade.yml rolls exactly those two, one
at a time behind the standby router, and no request fails; the front door never reaches fewer than 3 of
the 4 prefill instances. --check first prints the steps and restarts nothing; a second run changes
nothing. (benchmarks/upgrade.py --scenario flag rolls all four and prints the figures.)"""
import pytest
import yaml

from conftest import LAB_ENV
from inventories import ROOT, inventory_variant
from pdctl import runner
from pdctl.lab.load import FrontdoorCapacity, StreamLoad
from test_serving import CA, FRONTDOOR, INSTANCES, client_key, on_host
from test_two_routers_lab import _frontdoor_servers

pytestmark = [pytest.mark.lab, pytest.mark.slow]

HOST = "lab-prefill-1"  # prefill-2 and prefill-3 change; prefill-0/1 on lab-prefill-0 must not restart


def _main_pids():
    return {name: on_host(host, "systemctl", "show", "-p", "MainPID", "--value", "pdctl-vllm-%s.service" % name).strip()
            for host, names in INSTANCES.items() for name in names}


def _changed(result):
    return dict(result.stats.get("changed") or {})


def _stdout(result):
    return (result.artifact_dir / "stdout").read_text()


@pytest.fixture
def flag_change(converged_lab, tmp_path):
    """An inventory where HOST's prefill instances drain for 240 s instead of 300 on SIGTERM; afterwards
    the lab is rolled back to its own inventory (the same playbook)."""
    serving = yaml.safe_load((ROOT / "inventories/lab/group_vars/all/serving.yml").read_text())
    prefill = [("240" if prev == "--shutdown-timeout" else a)
               for prev, a in zip([None] + serving["pdctl_serve_args"]["prefill"], serving["pdctl_serve_args"]["prefill"])]
    assert prefill != serving["pdctl_serve_args"]["prefill"]
    inv = inventory_variant(tmp_path / "flag", {
        "host_vars/%s" % HOST: {"pdctl_serve_args": dict(serving["pdctl_serve_args"], prefill=prefill)}})
    yield inv
    result = runner.run_playbook("playbooks/upgrade.yml", ROOT / "inventories/lab", envvars=LAB_ENV)
    assert result.ok, result.failures


def test_check_mode_prints_the_steps_and_restarts_nothing(flag_change):
    before = _main_pids()
    result = runner.run_playbook("playbooks/upgrade.yml", flag_change, check=True, envvars=LAB_ENV)
    assert result.ok, result.failures
    out = " ".join(_stdout(result).split())
    assert "2 instance(s) to roll one at a time: prefill-2, prefill-3" in out
    assert "Instance restarts on its new unit: prefill-2" in out
    assert _main_pids() == before
    assert _frontdoor_servers() == {"lab-decode-0": "UP", "lab-decode-0-standby": "MAINT"}


def test_prefill_flag_change_rolls_one_instance_at_a_time_and_loses_no_request(flag_change):
    before = _main_pids()
    capacity = FrontdoorCapacity("lab-decode-0")
    capacity.start()
    with StreamLoad(FRONTDOOR, client_key(), clients=8, verify=CA) as load:
        result = runner.run_playbook("playbooks/upgrade.yml", flag_change, envvars=LAB_ENV)
    capacity.stop()
    summary = load.summary()
    print("flag upgrade of %s: %s, prefill capacity min %s over %d samples"
          % (HOST, summary, capacity.minimum(), len(capacity.samples)))
    assert result.ok, result.failures
    after = _main_pids()
    assert {n for n in before if before[n] != after[n]} == {"prefill-2", "prefill-3"}, (before, after)
    assert "--shutdown-timeout 240" in on_host(HOST, "systemctl", "show", "-p", "ExecStart", "--value",
                                                "pdctl-vllm-prefill-2.service")
    assert summary["requests"] >= 40 and summary["failed_requests"] == 0, summary
    assert len(capacity.samples) >= 10 and capacity.minimum() == 3, (capacity.minimum(), capacity.errors[:2])

    # Everything back in its place: the router in rotation, its standby out and gone.
    assert _frontdoor_servers() == {"lab-decode-0": "UP", "lab-decode-0-standby": "MAINT"}
    assert on_host("lab-decode-0", "systemctl", "show", "-p", "LoadState", "--value",
                   "pdctl-router-standby.service").strip() == "not-found"

    again = runner.run_playbook("playbooks/upgrade.yml", flag_change, envvars=LAB_ENV)
    assert again.ok, again.failures
    assert set(_changed(again).values()) <= {0}, _changed(again)
    assert _main_pids() == after
