"""Quarantine of prefill hosts that fail their checks (pdctl_min_prefill_instances): the planner's
validation of the minimum, topology.quarantine, its filter, and how `pdctl report` / `pdctl run` show it.
The plays: tests/unit/test_quarantine_play.py; the lab: tests/integration/test_quarantine_lab.py."""
import json
import time
from pathlib import Path

import pytest

from ansible_collections.pdctl.vllm_pd.plugins.filter.pdctl import quarantine_plan
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import topology
from inventories import ROOT, inventory_variant
from pdctl import cli, inventory, report, run, runner

P0, P1, D0 = "lab-prefill-0", "lab-prefill-1", "lab-decode-0"
GROUPS = {"all": [P0, P1, D0], "serving": [P0, P1, D0], "prefill": [P0, P1], "decode": [D0], "router": [D0],
          "frontdoor": [D0]}
MISSING_GPU = {"host": P1, "task": "Host sees every GPU at the manifest driver version",
               "msg": "lab-prefill-1: 7 GPUs at driver 580.95.05, expected 8 GPUs at driver 580.95.05. "
                      "GPU slot 5 (00000000:BB:00.0) missing;"}


def lab_plan(minimum=None):
    hosts = inventory.load(ROOT / "inventories/lab")
    if minimum is not None:
        for h in hosts.values():
            h["vars"][topology.MIN_PREFILL_VAR] = minimum
    return topology.build_plan(hosts)


def test_unset_minimum_keeps_todays_plan():
    plan = lab_plan()
    assert plan["min_prefill_instances"] is None and plan["quarantined"] == []


@pytest.mark.parametrize("value", [1, 4, "2", " 3 "])
def test_minimum_is_an_integer_up_to_the_planned_prefill_instances(value):
    assert lab_plan(value)["min_prefill_instances"] == int(value)


@pytest.mark.parametrize("value,words", [
    (0, "pdctl_min_prefill_instances is 0: it must be from 1 to the 4 planned prefill instances"),
    (5, "pdctl_min_prefill_instances is 5"),
    (-1, "pdctl_min_prefill_instances is -1"),
    ("2.5", "must be an integer from 1 to the 4 planned prefill instances, found '2.5'"),
    (True, "must be an integer from 1 to the 4 planned prefill instances, found True"),
    (2.0, "found 2.0"),
    ([2], "found [2]"),
])
def test_a_bad_minimum_is_rejected_before_anything_changes(value, words):
    with pytest.raises(topology.PlanError) as exc:
        lab_plan(value)
    assert any(words in p for p in exc.value.problems), exc.value.problems


def test_pdctl_plan_exits_2_on_a_bad_minimum(tmp_path, capsys):
    inv = inventory_variant(tmp_path / "inv", {"group_vars/all": {"pdctl_min_prefill_instances": 9}})
    assert cli.main(["plan", "-i", str(inv)]) == 2
    assert "pdctl_min_prefill_instances is 9" in capsys.readouterr().err


def test_quarantine_leaves_the_hosts_instances_out_of_every_router():
    plan = lab_plan(2)
    out = topology.quarantine(plan, [MISSING_GPU], GROUPS)
    assert [i["name"] for i in out["instances"]] == ["decode-0", "prefill-0", "prefill-1"]
    gone = [i["url"] for i in plan["instances"] if i["host"] == P1]
    assert len(gone) == 2
    for router in out["routers"] + [out["router"]]:
        assert router["prefill_urls"] == [u for u in plan["router"]["prefill_urls"] if u not in gone]
        assert router["decode_urls"] == plan["router"]["decode_urls"]
    assert out["quarantined"] == [{
        "host": P1, "instances": ["prefill-2", "prefill-3"],
        "units": ["pdctl-vllm-prefill-2.service", "pdctl-vllm-prefill-3.service"],
        "failures": [{"task": MISSING_GPU["task"], "msg": MISSING_GPU["msg"]}],
        "reason": "%s: %s" % (MISSING_GPU["task"], MISSING_GPU["msg"])}]
    # The plan itself is unchanged (every host computed it; the quarantine is a copy).
    assert len(plan["instances"]) == 5 and plan["quarantined"] == []
    # Everything else the later plays read stays: the hosts (monitored), front door, model, minimum.
    for key in ("hosts", "frontdoor", "model_path", "vllm_version", "min_prefill_instances"):
        assert out[key] == plan[key], key
    # The KV-path check no longer reads from the quarantined host.
    assert {p["prefill_host"] for p in topology.kv_check_paths(out, 7000)} == {P0}
    assert "quarantined: lab-prefill-1 (prefill-2, prefill-3): Host sees every GPU" in topology.format_table(out)


def test_no_failure_changes_nothing():
    plan = lab_plan(2)
    assert topology.quarantine(plan, [], GROUPS) is plan


def test_too_few_remaining_fails_naming_each_host_and_its_failure():
    with pytest.raises(topology.QuarantineError) as exc:
        topology.quarantine(lab_plan(4), [MISSING_GPU], GROUPS)
    (problem,) = exc.value.problems
    assert problem.startswith("2 of 4 prefill instances would remain, fewer than pdctl_min_prefill_instances=4")
    assert "lab-prefill-1 (Host sees every GPU at the manifest driver version: lab-prefill-1: 7 GPUs" in problem


def test_both_prefill_hosts_failed_is_below_any_minimum():
    other = dict(MISSING_GPU, host=P0, task="Every RDMA device the inventory names is present and ACTIVE",
                 msg=["lab-prefill-0: RDMA devices not ready -", "device mlx5_6 port 1: state 1: DOWN"])
    with pytest.raises(topology.QuarantineError) as exc:
        topology.quarantine(lab_plan(1), [MISSING_GPU, other], GROUPS)
    (problem,) = exc.value.problems
    assert "0 of 4 prefill instances would remain" in problem
    # Hosts in order, a list message on one line.
    assert problem.index(P0) < problem.index(P1)
    assert "lab-prefill-0: RDMA devices not ready - device mlx5_6 port 1: state 1: DOWN" in problem


@pytest.mark.parametrize("groups,words", [
    (dict(GROUPS, router=[D0, P1]), "it is in router"),
    (dict(GROUPS, frontdoor=[P1]), "it is in frontdoor"),
    (dict(GROUPS, prefill=[P0]), "it is in no prefill group"),
])
def test_only_a_prefill_only_host_can_be_quarantined(groups, words):
    with pytest.raises(topology.QuarantineError) as exc:
        topology.quarantine(lab_plan(1), [MISSING_GPU], groups)
    assert any("lab-prefill-1 (Host sees every GPU" in p and "cannot be quarantined" in p and words in p
               for p in exc.value.problems), exc.value.problems


def test_decode_host_cannot_be_quarantined():
    failed = dict(MISSING_GPU, host=D0)
    with pytest.raises(topology.QuarantineError) as exc:
        topology.quarantine(lab_plan(1), [failed], GROUPS)
    assert "lab-decode-0 (Host sees every GPU" in exc.value.problems[0]
    assert "it is in decode, frontdoor, router" in exc.value.problems[0]


def test_without_a_minimum_nothing_is_quarantined():
    with pytest.raises(topology.QuarantineError) as exc:
        topology.quarantine(lab_plan(), [MISSING_GPU], GROUPS)
    assert "pdctl_min_prefill_instances is not set, so no host is quarantined: lab-prefill-1" in exc.value.problems[0]


def test_filter_returns_the_plan_or_the_errors():
    ok = quarantine_plan(lab_plan(2), [MISSING_GPU], GROUPS)
    assert ok["errors"] == [] and [q["host"] for q in ok["plan"]["quarantined"]] == [P1]
    bad = quarantine_plan(lab_plan(3), [MISSING_GPU], GROUPS)
    assert bad["plan"] is None and "fewer than pdctl_min_prefill_instances=3" in bad["errors"][0]


def test_report_names_the_quarantined_host_and_its_failure(tmp_path, capsys):
    q = topology.quarantine(lab_plan(2), [MISSING_GPU], GROUPS)["quarantined"]
    (tmp_path / "quarantine").mkdir()
    (tmp_path / "quarantine/last.json").write_text(json.dumps(
        {"time": time.time() - 30, "min_prefill_instances": "2", "quarantined": q}))
    report.main(type("Args", (), {"inventory": str(ROOT / "inventories/b300"), "artifacts": str(tmp_path)})())
    out = capsys.readouterr().out
    assert "s ago; pdctl_min_prefill_instances 2)" in out and "== quarantine (host-stack checks 3" in out
    assert "QUARANTINED lab-prefill-1 (prefill-2, prefill-3): out of every router, instances stopped" in out
    assert "GPU slot 5 (00000000:BB:00.0) missing" in out


def test_report_without_a_verdict_or_with_none_quarantined(tmp_path, capsys):
    args = type("Args", (), {"inventory": str(ROOT / "inventories/b300"), "artifacts": str(tmp_path)})()
    report.main(args)
    assert "== quarantine" not in capsys.readouterr().out
    (tmp_path / "quarantine").mkdir()
    (tmp_path / "quarantine/last.json").write_text(json.dumps({"time": time.time(), "min_prefill_instances": None,
                                                                "quarantined": []}))
    report.main(args)
    out = capsys.readouterr().out
    assert "pdctl_min_prefill_instances unset: a failed host fails the run" in out and "no host quarantined" in out


def test_pdctl_run_summary_carries_the_quarantine_report():
    recorder = runner._Recorder()
    recorder({"event": "playbook_on_play_start", "event_data": {"play": "Quarantine"}})
    recorder({"event": "runner_on_ok", "event_data": {"host": P0, "task": runner.QUARANTINE_REPORT_TASK,
                                                      "res": {"msg": ["Quarantined ...", "lab-prefill-1: ..."]}}})
    result = runner.PlaybookResult(rc=0, status="successful", stats={}, artifact_dir=Path("/tmp/a"),
                                   outcomes=list(recorder.outcomes.values()), quarantine=recorder.quarantine)
    doc = run.summary(result, "site.yml", "inv", 0, 1.0)
    assert doc["quarantined"] == ["Quarantined ...", "lab-prefill-1: ..."] and doc["outcome"] == "accepted"


def test_report_shows_each_host_maintenance_turn_and_the_host_left_out(tmp_path, capsys):
    (tmp_path / "maintenance").mkdir()
    (tmp_path / "maintenance" / "last.json").write_text(json.dumps({
        "time": 0, "driver": "580.105.08", "hosts": ["lab-prefill-0", "lab-prefill-1", "lab-decode-0"],
        "turns": {"lab-prefill-0": {"seconds": 47.0, "activation": "reboot", "passed": True, "failure": {}},
                  "lab-prefill-1": {"seconds": 51.2, "activation": "reboot", "passed": False,
                                    "failure": {"task": "NVLinks are up", "reason": "GPU 2 link 7 down"}}}}))
    report.main(type("Args", (), {"inventory": str(ROOT / "inventories/b300"), "artifacts": str(tmp_path)})())
    out = capsys.readouterr().out
    assert "== host maintenance" in out and "NVIDIA driver 580.105.08" in out
    assert "done lab-prefill-0 in 47.0 s (reboot)" in out
    assert "OUT OF SERVICE lab-prefill-1 after 51.2 s (reboot): NVLinks are up\n  GPU 2 link 7 down" in out
    assert "NOT TOUCHED lab-decode-0" in out
