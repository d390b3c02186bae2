"""Rolling upgrade of a compatible change (issue 15, acceptance 1), on the lab under 8 streaming clients:
a flag of lab-prefill-1's prefill instances changes; playbooks/upgrade.yml rolls exactly those two, one
at a time behind the standby router, and no request fails; the front door never reaches fewer than 3 of
the 4 prefill instances. --check first prints the steps and restarts nothing; a second run changes
nothing. (benchmarks/upgrade.py --scenario flag rolls all four and prints the figures.)

The release switch's record (/var/lib/pdctl/release-switch.json) is read before anything changes: a
rollback with nothing to undo, a release that was rolled back, and a new target while a switch is in
progress are refused, touching nothing. (The switch and its automatic rollback take minutes each:
benchmarks/upgrade.py --scenario release / bad-sla / bad-accuracy / release-interrupted; the last, with one
kill, runs here.)"""
import json
import re
import subprocess
import sys

import pytest
import yaml

from conftest import LAB_ENV
from inventories import ROOT, inventory_variant, group_var
from pdctl import runner
from pdctl.lab.load import FrontdoorCapacity, StreamLoad
from test_serving import CA, FRONTDOOR, INSTANCES, client_key, main_pids, on_host
from test_two_routers_lab import _frontdoor_servers

pytestmark = [pytest.mark.lab, pytest.mark.slow]

# Both router hosts' routers in rotation, their standbys out (as the front door on lab-decode-0 sees them).
ROUTERS_AT_REST = {"lab-decode-0": "UP", "lab-decode-0-standby": "MAINT",
                   "lab-prefill-0": "UP", "lab-prefill-0-standby": "MAINT"}
HOST = "lab-prefill-1"  # prefill-2 and prefill-3 change; prefill-0/1 on lab-prefill-0 must not restart


def _changed(result):
    return dict(result.stats.get("changed") or {})


def _stdout(result):
    return (result.artifact_dir / "stdout").read_text()


def plain_output(result):
    """The run's output on one line, without colours (they split the lines Ansible wraps)."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", _stdout(result)).split()).replace("''", "'")


def _serving_state():
    """What an upgrade can change: every serving host's pdctl units and environment files (the standby
    router's unit among them), the instances' processes, the front door's view of the routers."""
    files = {h: on_host(h, "sh", "-c", "sha256sum /etc/systemd/system/pdctl-*.service /etc/pdctl/*.env 2>&1; true")
             for h in INSTANCES}
    return {"files": files, "pids": main_pids(), "frontdoor": _frontdoor_servers()}


@pytest.fixture
def flag_change(converged_lab, tmp_path):
    """An inventory where HOST's prefill instances drain for 240 s instead of 300 on SIGTERM; afterwards
    the lab is rolled back to its own inventory (the same playbook), unless nothing changed (check mode):
    that run back would be a whole upgrade.yml with nothing to do."""
    before = _serving_state()
    serving = {"pdctl_serve_args": group_var("lab", "pdctl_serve_args")}
    prefill = [("240" if prev == "--shutdown-timeout" else a)
               for prev, a in zip([None] + serving["pdctl_serve_args"]["prefill"], serving["pdctl_serve_args"]["prefill"])]
    assert prefill != serving["pdctl_serve_args"]["prefill"]
    inv = inventory_variant(tmp_path / "flag", {
        "host_vars/%s" % HOST: {"pdctl_serve_args": dict(serving["pdctl_serve_args"], prefill=prefill)}})
    yield inv
    if _serving_state() == before:
        return
    result = runner.run_playbook("playbooks/upgrade.yml", ROOT / "inventories/lab", envvars=LAB_ENV)
    assert result.ok, result.failures


def test_check_mode_prints_the_steps_and_restarts_nothing(flag_change):
    before = _serving_state()
    result = runner.run_playbook("playbooks/upgrade.yml", flag_change, check=True, envvars=LAB_ENV)
    assert result.ok, result.failures
    out = plain_output(result)
    # pdctl_rollout_prefill_keep 0.5 of 4: both of HOST's instances in one batch (2 of 4 keep serving).
    assert "2 instance(s) to roll: prefill-2, prefill-3; prefill in batches [prefill-2, prefill-3]" in out
    assert "Standby router without prefill-2, prefill-3" in out
    after = _serving_state()
    assert after["pids"] == before["pids"]
    assert after["files"] == before["files"], "check mode wrote a unit or an environment file"
    assert after["frontdoor"] == ROUTERS_AT_REST


def test_prefill_flag_change_rolls_a_batch_together_and_loses_no_request(flag_change):
    """Both of HOST's instances change: one batch (pdctl_rollout_prefill_keep 0.5 of 4), out of the routers and
    restarted together, the other host's two serving meanwhile."""
    before = main_pids()
    capacity = FrontdoorCapacity("lab-decode-0")
    capacity.start()
    with StreamLoad(FRONTDOOR, client_key(), clients=8, verify=CA) as load:
        result = runner.run_playbook("playbooks/upgrade.yml", flag_change, envvars=LAB_ENV)
    capacity.stop()
    summary = load.summary()
    print("flag upgrade of %s: %s, prefill capacity min %s over %d samples"
          % (HOST, summary, capacity.minimum(), len(capacity.samples)))
    assert result.ok, result.failures
    after = main_pids()
    assert {n for n in before if before[n] != after[n]} == {"prefill-2", "prefill-3"}, (before, after)
    assert "--shutdown-timeout 240" in on_host(HOST, "systemctl", "show", "-p", "ExecStart", "--value",
                                                "pdctl-vllm-prefill-2.service")
    assert summary["requests"] >= 40 and summary["failed_requests"] == 0, summary
    assert len(capacity.samples) >= 10 and capacity.minimum() == 2, (capacity.minimum(), capacity.errors[:2])

    # Everything back in its place: the router in rotation, its standby out and gone.
    assert _frontdoor_servers() == ROUTERS_AT_REST
    assert on_host("lab-decode-0", "systemctl", "show", "-p", "LoadState", "--value",
                   "pdctl-router-standby.service").strip() == "not-found"

    again = runner.run_playbook("playbooks/upgrade.yml", flag_change, envvars=LAB_ENV)
    assert again.ok, again.failures
    assert set(_changed(again).values()) <= {0}, _changed(again)
    assert main_pids() == after


def _decode_flag_change(tmp_path):
    """An inventory where the decode instance drains for 240 s instead of 300 on SIGTERM."""
    serving = {"pdctl_serve_args": group_var("lab", "pdctl_serve_args")}
    decode = [("240" if prev == "--shutdown-timeout" else a)
              for prev, a in zip([None] + serving["pdctl_serve_args"]["decode"], serving["pdctl_serve_args"]["decode"])]
    assert decode != serving["pdctl_serve_args"]["decode"]
    return inventory_variant(tmp_path / "decode-flag", {
        "host_vars/lab-decode-0": {"pdctl_serve_args": dict(serving["pdctl_serve_args"], decode=decode)}})


def test_decode_flag_change_in_check_mode_plans_a_temporary_decode_and_restarts_nothing(converged_lab, tmp_path):
    """CI's short version of the next test (benchmarks/upgrade.py --scenario decode-flag runs it in full, under
    load): the decode instance's flag changes; check mode decides the decode rolls behind a temporary decode on
    prefill-3's GPUs, prints the steps with the capacity at each, and touches nothing."""
    before = _serving_state()
    result = runner.run_playbook("playbooks/upgrade.yml", _decode_flag_change(tmp_path), check=True, envvars=LAB_ENV)
    assert result.ok, result.failures
    out = plain_output(result)
    assert "1 instance(s) to roll: decode-0; the decode behind a temporary decode on prefill-3's GPUs" in out, out[-2000:]
    assert "[prefill 3/4, decode GPUs 4/8" in out, out[-2000:]
    after = _serving_state()
    assert after["pids"] == before["pids"]
    assert after["files"] == before["files"], "check mode wrote a unit or an environment file"
    assert after["frontdoor"] == ROUTERS_AT_REST


@pytest.mark.long  # benchmarks/upgrade.py --scenario decode-flag
def test_decode_flag_change_rolls_behind_a_temporary_decode_and_loses_no_request(converged_lab, tmp_path):
    """Issue 41: the decode instance's --shutdown-timeout changes. Under 8 streams the upgrade lends prefill-3's
    GPUs to a temporary decode, the routers pair the other three prefill instances with it, decode-0 restarts on
    its new unit, then everything goes back: no request fails, the front door never reaches fewer than 3 of 4
    prefill instances, only decode-0 and the lender restart, nothing is left behind; a second run changes nothing.
    Then the inventory's flag again, the same way."""
    inv = _decode_flag_change(tmp_path)
    before = main_pids()
    since = on_host("lab-prefill-1", "date", "+%Y-%m-%d %H:%M:%S").strip()
    capacity = FrontdoorCapacity("lab-decode-0")
    capacity.start()
    try:
        with StreamLoad(FRONTDOOR, client_key(), clients=8, verify=CA) as load:
            result = runner.run_playbook("playbooks/upgrade.yml", inv, envvars=LAB_ENV)
        capacity.stop()
        summary = load.summary()
        print("decode flag upgrade: %s, prefill capacity min %s over %d samples"
              % (summary, capacity.minimum(), len(capacity.samples)))
        assert result.ok, result.failures
        out = plain_output(result)
        assert "the decode behind a temporary decode on prefill-3's GPUs" in out, out[-2000:]
        after = main_pids()
        assert {n for n in before if before[n] != after[n]} == {"decode-0", "prefill-3"}, (before, after)
        assert "--shutdown-timeout 240" in on_host("lab-decode-0", "systemctl", "show", "-p", "ExecStart", "--value",
                                                    "pdctl-vllm-decode-0.service")
        assert summary["requests"] >= 40 and summary["failed_requests"] == 0, summary
        assert len(capacity.samples) >= 10 and capacity.minimum() == 3, (capacity.minimum(), capacity.errors[:2])
        # The temporary decode pulled KV from the other prefill host's instances too (the firewall admits it):
        # a pull that fails is recomputed after NIXL's timeout, invisible to the clients but 30 s of TTFT.
        temporary = on_host("lab-prefill-1", "journalctl", "--no-pager", "-u", "pdctl-vllm-decode-temporary",
                            "--since", since)
        assert "Started pdctl-vllm-decode-temporary" in temporary, temporary[-500:]
        assert "KV load failed" not in temporary, [ln for ln in temporary.splitlines() if "KV load failed" in ln][:3]
        assert _frontdoor_servers() == ROUTERS_AT_REST
        for host, unit in (("lab-decode-0", "pdctl-router-standby.service"),
                           ("lab-prefill-1", "pdctl-vllm-decode-temporary.service")):
            assert on_host(host, "systemctl", "show", "-p", "LoadState", "--value", unit).strip() == "not-found", unit
        assert subprocess.run(["podman", "exec", "lab-decode-0", "test", "-e", "/var/lib/pdctl/maintenance-turn.json"]
                              ).returncode == 1, "the decode turn's record was left behind"
        again = runner.run_playbook("playbooks/upgrade.yml", inv, envvars=LAB_ENV)
        assert again.ok, again.failures
        assert set(_changed(again).values()) <= {0}, _changed(again)
    finally:
        capacity.stop()
        back = runner.run_playbook("playbooks/upgrade.yml", ROOT / "inventories/lab", envvars=LAB_ENV)
        assert back.ok, back.failures


JOURNAL = "/var/lib/pdctl/release-switch.json"


@pytest.fixture
def switch_record(converged_lab):
    """Writes a release-switch record on every serving host (None: none); the lab's own record (a
    benchmark may have left one) comes back afterwards."""
    saved = {host: subprocess.run(["podman", "exec", host, "cat", JOURNAL], capture_output=True, text=True).stdout
             for host in INSTANCES}

    def put(record):
        for host in INSTANCES:
            if record is None:
                on_host(host, "rm", "-f", JOURNAL)
            else:
                subprocess.run(["podman", "exec", "-i", host, "sh", "-c", "cat > " + JOURNAL],
                               input=json.dumps(record), text=True, check=True)
    yield put
    for host, text in saved.items():
        if text:
            subprocess.run(["podman", "exec", "-i", host, "sh", "-c", "cat > " + JOURNAL], input=text, text=True,
                           check=True)
        else:
            on_host(host, "rm", "-f", JOURNAL)


REFUSAL_TASK = "A rollback has a switch to undo, and a switch in progress is finished before another"


def _refused(result):
    assert not result.ok
    assert [f["task"] for f in result.failures] == [REFUSAL_TASK], result.failures
    assert set(_changed(result).values()) <= {0}, _changed(result)
    return " ".join(result.failures[0]["msg"].split())


def test_rollback_with_no_switch_recorded_is_refused(switch_record):
    switch_record(None)
    before = main_pids()
    result = runner.run_playbook("playbooks/upgrade.yml", ROOT / "inventories/lab", envvars=LAB_ENV,
                                 extra_args=["-e", "upgrade_rollback=true"])
    assert "nothing to roll back: /var/lib/pdctl/release-switch.json records no release switch" in _refused(result)
    assert main_pids() == before


def _target_play(tmp_path):
    """upgrade.yml's target play alone (it reads the hosts' switch records and refuses, or not), in a
    playbook beside links to playbooks/vars and playbooks/tasks so that its relative paths resolve as in
    upgrade.yml."""
    plays = yaml.safe_load((ROOT / "playbooks/upgrade.yml").read_text())
    (target,) = [p for p in plays if any(t["name"] == REFUSAL_TASK for t in p.get("tasks", []))]
    book = tmp_path / "upgrade-target" / "target.yml"
    book.parent.mkdir()
    for name in ("vars", "tasks"):
        (book.parent / name).symlink_to(ROOT / "playbooks" / name)
    book.write_text(yaml.safe_dump([target], sort_keys=False))
    return book


def test_a_release_that_was_rolled_back_is_refused_until_retried(switch_record, tmp_path):
    switch_record({"from": "0.33.0", "to": "lab-0.2.1", "state": "rolled-back", "reason": "the gates failed: test",
                   "since": "2026-12-01T00:00:00+00:00"})
    target = ["-e", "vllm_version=lab-0.2.1", "-e", "pdctl_lab_engine_release=bad-sla"]
    result = runner.run_playbook("playbooks/upgrade.yml", ROOT / "inventories/lab", envvars=LAB_ENV, extra_args=target,
                                 check=True)
    msg = _refused(result)
    assert "lab-0.2.1 was rolled back (the gates failed: test); the hosts run 0.33.0" in msg
    assert "-e upgrade_retry=true" in msg
    # The manifest's own release is not the one rolled back: nothing refused. The target play alone decides
    # that; after it a rolled-back record reads as none (only a switch or a rollback in progress resumes),
    # and upgrade.yml's whole check-mode pass is test_check_mode_prints_the_steps_and_restarts_nothing's.
    result = runner.run_playbook(str(_target_play(tmp_path)), ROOT / "inventories/lab", envvars=LAB_ENV, check=True)
    assert result.ok, result.failures
    assert [r.get("msg") for r in result.task_results(REFUSAL_TASK).values()] == ["All assertions passed"]


def test_a_new_target_during_a_switch_is_refused_naming_both(switch_record):
    switch_record({"from": "0.33.0", "to": "lab-0.2.0", "state": "switching", "reason": "",
                   "since": "2026-12-01T00:00:00+00:00"})
    result = runner.run_playbook("playbooks/upgrade.yml", ROOT / "inventories/lab", envvars=LAB_ENV, check=True)
    msg = _refused(result)
    assert "a switch from 0.33.0 to lab-0.2.0 is in progress" in msg and "`pdctl rollback`" in msg


@pytest.mark.long  # benchmarks/upgrade.py --scenario release-interrupted (four kills); CI: the check-mode tests above
def test_a_release_switch_killed_mid_switch_resumes_and_rolls_back_losing_no_request(converged_lab):
    """The hardest path, in short (issue 37): under 8 streams, the bad-sla release as the target; the playbook is
    killed (SIGKILL to its process group) 3 s into the switch's pairing and run again: it resumes the switch, the
    gates fail, it rolls every instance back to release A by itself and exits non-zero naming the gate; a second
    run with the same target is refused and changes nothing; then the inventory's release, nothing to do. This is
    benchmarks/upgrade.py's release-interrupted with one of its four kills (the benchmark judges the end state:
    routers, standby and temporary decode gone, capacity never under 1 of 4, no KV pull across releases)."""
    proc = subprocess.run([sys.executable, "benchmarks/upgrade.py", "--scenario", "release-interrupted",
                           "--kills", "switch"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    print(proc.stderr[-4000:])
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps(line))
    # The kill landed inside the switch (the task the killed run was in), not before it or after the playbook.
    assert [k["point"] for k in line["kills"]] == ["switch"], line
    assert line["kills"][0]["killed_in"] and "TASK [" in line["kills"][0]["killed_in"], line
    assert line["rollback_s"], "no rollback was recorded: %s" % line
    assert line["releases_after"] == ["A"], line
    assert "gates failed" in " ".join(line.get("reason") or []), line
    assert line["failed_requests"] == 0 and line["requests"] > 100, line
    assert line["second_run_exit"] != 0 and line["second_run_changed"] == 0, line
    assert line["verdict"] == "pass" and proc.returncode == 0, line
