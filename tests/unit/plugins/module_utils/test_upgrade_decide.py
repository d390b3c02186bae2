# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""module_utils/upgrade_decide.py: what a run of playbooks/upgrade.yml aims at and what one pass rolls, from what the
hosts report, at every point where the lab tests and benchmarks/upgrade.py kill the playbook and run it again
(KILL_POINTS: staging, switch, late, rollback; DECODE_KILLS: the temporary decode starting, the decode restarting,
the lender starting again), and the upgrades it refuses before touching an instance. On a plan built here, shaped
like the lab's (run by `ansible-test units` and by pytest)."""
from __future__ import annotations

import pytest

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import rollout_plan as rp
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import upgrade_decide as ud

JOURNAL = "/var/lib/pdctl/release-switch.json"
TURN = "/var/lib/pdctl/maintenance-turn.json"
OLD, NEW = "0.33.0", "lab-0.2.0"
# The planner's order: the decode host's instance first.
HOSTS = {"decode-0": "d0", "prefill-0": "p0", "prefill-1": "p0", "prefill-2": "p1", "prefill-3": "p1"}
SERVING = ["d0", "p0", "p1"]


def plan(hosts=None, standby=True):
    hosts = HOSTS if hosts is None else hosts
    instances = [{"name": n, "host": h, "pool": n.split("-", maxsplit=1)[0], "gpus": [0, 1], "url": "http://%s/%s" % (h, n)}
                 for n, h in hosts.items()]
    routers = [{"host": "d0", "standby_port": 8001}, {"host": "p0", "standby_port": 8001 if standby else None}]
    return {"instances": instances, "routers": routers}


def host(pending=(), release=False, stopped=(), turn=None, current="/opt/pdctl/venvs/vllm-" + OLD):
    return {"pending": list(pending), "release_changes": release, "stopped": list(stopped), "turn": turn,
            "current": current}


def rolls(hosts, journal=None, target=NEW, rolling_back=False, the_plan=None, keep=1):
    the_plan = the_plan or plan()
    reports = {h: hosts.get(h) or host() for h in SERVING}
    return ud.rolls(the_plan["instances"], the_plan["routers"], SERVING, reports, journal or {}, target, rolling_back,
                    JOURNAL, TURN, keep)


def names(instances):
    return [i["name"] for i in instances]


def switching(**kw):
    return dict({"from": OLD, "to": NEW, "state": "switching", "reason": "", "since": "2026-12-01T00:00:00+00:00"}, **kw)


# ---------------------------------------------------------------- target(): what the run aims at

def test_no_record_the_manifests_release():
    got = ud.target([], NEW)
    assert got["problem"] is None and got["state"] == "none" and got["journal"] == {}
    assert got["target_release"] == NEW and not got["rolling_back"] and not got["record_rollback"]


def test_a_rollback_with_no_switch_recorded_is_refused():
    got = ud.target([], OLD, rollback="true")
    assert got["problem"] == "nothing to roll back: %s records no release switch." % JOURNAL
    assert ud.target([switching(state="rolled-back")], OLD, rollback=True)["problem"] == (
        "nothing to roll back: %s records the switch to %s as rolled-back." % (JOURNAL, NEW))


def test_a_requested_rollback_of_an_accepted_switch_is_recorded_first():
    got = ud.target([switching(state="accepted")], NEW, rollback="yes")
    assert got["problem"] is None and got["rolling_back"] and got["record_rollback"]
    assert got["target_release"] == OLD and got["reason"] == "requested (pdctl rollback)"


def test_a_rollback_during_a_switch_is_refused():
    got = ud.target([switching()], NEW, rollback=True)
    assert got["problem"].startswith("the switch from %s to %s is not finished" % (OLD, NEW))


def test_killed_during_the_switch_resumes_it_with_the_same_target():
    got = ud.target([switching()], NEW)
    assert got["problem"] is None and got["target_release"] == NEW and not got["rolling_back"]


def test_a_new_target_during_a_switch_is_refused_naming_both():
    msg = ud.target([switching()], "lab-0.2.1")["problem"]
    assert msg == ("a switch from %s to %s is in progress (%s): run the upgrade with %s to finish it, or `pdctl "
                   "rollback` to return to %s; nothing was touched." % (OLD, NEW, JOURNAL, NEW, OLD))


def test_killed_during_the_rollback_resumes_it_whatever_the_manifest_says():
    back = switching(state="rolling-back", reason="the gates failed on lab-0.2.0: SLA")
    for configured in (NEW, OLD, "lab-0.2.1"):
        got = ud.target([back], configured)
        assert got["problem"] is None and got["rolling_back"] and not got["record_rollback"]
        assert got["target_release"] == OLD and got["reason"] == back["reason"]


def test_a_release_that_was_rolled_back_is_refused_until_retried():
    done = {"from": OLD, "to": "lab-0.2.1", "state": "rolled-back", "reason": "the gates failed: test",
            "since": "2026-12-01T00:00:00+00:00"}
    msg = ud.target([done], "lab-0.2.1")["problem"]
    assert "lab-0.2.1 was rolled back (the gates failed: test); the hosts run 0.33.0" in msg
    assert "-e upgrade_retry=true" in msg
    assert ud.target([done], "lab-0.2.1", retry=True)["problem"] is None
    assert ud.target([done], OLD)["problem"] is None  # the manifest's own release is not the one rolled back


def test_records_killed_while_written_the_step_furthest_on_is_resumed():
    accepted = switching(state="accepted", since="2026-12-09T00:00:00+00:00")
    back = switching(state="rolling-back", since="2026-11-01T00:00:00+00:00")
    assert ud.switch_journal([accepted, switching(), back]) is back
    assert ud.switch_journal([accepted, switching()])["state"] == "switching"
    older = switching(state="accepted", since="2026-10-01T00:00:00+00:00")
    assert ud.switch_journal([older, accepted]) is accepted
    assert ud.switch_journal([]) == {}


def test_a_prefill_rollback_is_not_a_release_rollback():
    got = ud.target([switching(state="accepted")], NEW, rollback="prefill")
    assert got["requested_prefill"] and not got["requested"] and not got["rolling_back"]
    assert ud.target([], NEW, rollback="no")["requested"] is False


# ---------------------------------------------------------------- rolls(): a compatible change

def test_nothing_to_do():
    got = rolls({})
    assert got["problem"] is None and got["kind"] == "compatible"
    assert got["pending"] == [] and got["decode_roll"] == [] and got["rolled"] == []
    assert got["summary"] == "0 instance(s) to roll: none, nothing to do"


def test_a_prefill_flag_change_rolls_those_instances_one_at_a_time():
    got = rolls({"p1": host(pending=["prefill-3", "prefill-2"])})
    assert got["problem"] is None and got["kind"] == "compatible"
    assert names(got["prefill_roll"]) == ["prefill-2", "prefill-3"] and got["decode_roll"] == []
    assert got["summary"] == "2 instance(s) to roll: prefill-2, prefill-3; prefill in batches [prefill-2], [prefill-3]"


def test_a_prefill_flag_change_rolls_as_many_at_once_as_the_share_kept_allows():
    every = {"p0": host(pending=["prefill-0", "prefill-1"]), "p1": host(pending=["prefill-3", "prefill-2"])}
    got = rolls(every, keep=0.5)
    assert [names(b) for b in got["prefill_batches"]] == [["prefill-0", "prefill-1"], ["prefill-2", "prefill-3"]]
    assert got["summary"].endswith("prefill in batches [prefill-0, prefill-1], [prefill-2, prefill-3]")
    # A resumed run batches what is still pending: the rest of an interrupted batch goes on its own.
    assert [names(b) for b in rolls({"p1": host(pending=["prefill-3"])}, keep=0.5)["prefill_batches"]] == [["prefill-3"]]
    assert [names(b) for b in rolls(every, keep=0)["prefill_batches"]] == [["prefill-0", "prefill-1", "prefill-2",
                                                                            "prefill-3"]]


def test_a_decode_change_rolls_behind_a_temporary_decode_on_the_last_prefill_instance():
    got = rolls({"d0": host(pending=["decode-0"])})
    assert got["problem"] is None and names(got["decode_roll"]) == ["decode-0"] and not got["decode_resumed"]
    assert got["lender"]["name"] == "prefill-3" == rp.lender(plan())["name"]
    assert got["summary"] == ("1 instance(s) to roll: decode-0; the decode behind a temporary decode on "
                              "prefill-3's GPUs")


@pytest.mark.parametrize("reports", [
    # killed while the temporary decode starts: the lender stopped (pending), the decode not restarted yet
    {"d0": host(pending=["decode-0"], turn={"host": "d0", "lender": "prefill-3", "by": "upgrade"}),
     "p1": host(pending=["prefill-3"], stopped=["prefill-3"])},
    # killed while the decode restarts
    {"d0": host(pending=["decode-0"], stopped=["decode-0"], turn={"host": "d0", "lender": "prefill-3", "by": "upgrade"}),
     "p1": host(pending=["prefill-3"], stopped=["prefill-3"])},
], ids=["temporary-decode-starts", "decode-restarts"])
def test_a_decode_change_killed_midway_resumes_and_leaves_the_lender_to_it(reports):
    got = rolls(reports)
    assert got["problem"] is None and got["decode_resumed"] and names(got["decode_roll"]) == ["decode-0"]
    # The lender is the decode change's to bring back: the prefill roll would start it beside the temporary decode.
    assert names(got["pending"]) == ["decode-0"] and got["prefill_roll"] == []
    assert got["summary"] == ("1 instance(s) to roll: decode-0; the decode behind a temporary decode on "
                              "prefill-3's GPUs (resumed)")


def test_a_decode_change_killed_while_the_lender_starts_again_still_finishes_the_turn():
    got = rolls({"d0": host(turn={"host": "d0", "lender": "prefill-3", "by": "upgrade"}),
                 "p1": host(pending=["prefill-3"])})
    assert got["problem"] is None and names(got["decode_roll"]) == ["decode-0"] and got["pending"] == []
    assert got["rolled"] == ["decode-0"]
    assert got["summary"] == ("0 instance(s) to roll: none, nothing to do; the decode behind a temporary "
                              "decode on prefill-3's GPUs (resumed)")


def test_an_interrupted_maintenance_turn_is_refused():
    got = rolls({"d0": host(turn={"host": "d0", "lender": "prefill-3", "since": "t"})})
    assert got["problem"] == ("the maintenance turn of d0 was interrupted (%s): finish it first with `pdctl "
                              "maintain`; no instance was touched." % TURN)
    assert not got["decode_resumed"] and got["decode_roll"] == []


def test_a_decode_change_without_a_second_prefill_instance_is_refused():
    got = rolls({"d0": host(pending=["decode-0"])}, the_plan=plan({"decode-0": "d0", "prefill-0": "p0"}))
    assert got["problem"].startswith("decode instance(s) decode-0 would change: a temporary decode serves")


def test_no_standby_router_is_refused():
    got = rolls({"p1": host(pending=["prefill-2"])}, the_plan=plan(standby=False))
    assert got["problem"] == ("router(s) p0 have no standby: set pdctl_ports.router_standby and "
                              "router_standby_metrics (then site.yml, which plans them); no instance was touched.")


# ---------------------------------------------------------------- rolls(): the two-pool switch of a release

def test_a_new_release_stages_on_the_first_host_with_two_prefill_instances():
    got = rolls({h: host(pending=[n for n, where in HOSTS.items() if where == h], release=True) for h in SERVING})
    assert got["problem"] is None and got["kind"] == "release" and not got["switch_resumed"]
    assert got["staging_host"] == "p0" and names(got["staging"]) == ["prefill-0", "prefill-1"]
    assert not got["staging_switched"] and got["old_hosts"] == ["p1", "d0"]  # prefill hosts first, the decode's last
    assert got["switch_from"] == OLD and got["decode_roll"] == [] and got["prefill_roll"] == []
    assert got["summary"] == ("a new engine release: the two-pool switch to %s, its first pair on p0 (prefill-0 and a "
                              "temporary decode on prefill-1's GPUs); hosts to switch after it: p1, d0" % NEW)


def test_killed_during_staging_starts_the_switch_afresh():
    # KILL_POINTS staging: the venvs half installed, no link moved, nothing recorded.
    got = rolls({h: host(release=True) for h in SERVING})
    assert got["kind"] == "release" and not got["switch_resumed"] and not got["staging_switched"]


def test_killed_during_the_switch_resumes_after_the_staging_host():
    # KILL_POINTS switch: the staging host on the new release (its second instance stopped: the temporary decode
    # holds its GPUs), the others on the old one.
    got = rolls({"p0": host(pending=["prefill-1"], stopped=["prefill-1"], current="/opt/pdctl/venvs/vllm-" + NEW),
                 "p1": host(pending=["prefill-2", "prefill-3"], release=True),
                 "d0": host(pending=["decode-0"], release=True)}, journal=switching())
    assert got["problem"] is None and got["kind"] == "release" and got["switch_resumed"]
    assert got["staging_switched"] and got["old_hosts"] == ["p1", "d0"]
    assert got["summary"] == ("a new engine release: the two-pool switch to %s (resumed), its first pair on p0 "
                              "(prefill-0 and a temporary decode on prefill-1's GPUs) (switched already); hosts to "
                              "switch after it: p1, d0" % NEW)


def test_killed_late_in_the_switch_leaves_no_host_to_switch():
    # KILL_POINTS late: every link on the new release, the temporary decode stopping on the staging host.
    got = rolls({"p0": host(pending=["prefill-1"], stopped=["prefill-1"])}, journal=switching())
    assert got["problem"] is None and got["kind"] == "release" and got["switch_resumed"]
    assert got["staging_switched"] and got["old_hosts"] == []
    assert got["summary"].endswith("(switched already); hosts to switch after it: none")


def test_an_old_host_a_killed_run_left_stopped_is_switched_again():
    got = rolls({"p1": host(pending=["prefill-2"], stopped=["prefill-2"])}, journal=switching())
    assert got["old_hosts"] == ["p1"]


def test_killed_during_the_rollback_resumes_the_switch_back():
    # KILL_POINTS rollback: the record says rolling-back; the staging host back on the old release already.
    got = rolls({"p1": host(release=True), "d0": host(release=True)}, target=OLD, rolling_back=True,
                journal=switching(state="rolling-back", reason="the gates failed on lab-0.2.0: SLA"))
    assert got["problem"] is None and got["kind"] == "release" and got["switch_resumed"] and got["staging_switched"]
    assert got["summary"].startswith("rolling back: the two-pool switch to %s (resumed)" % OLD)


def test_a_resumed_switch_is_a_release_even_when_every_link_agrees():
    got = rolls({}, journal=switching())
    assert got["kind"] == "release" and got["staging_switched"] and got["old_hosts"] == []


def test_a_release_that_differs_on_some_hosts_only_is_refused():
    got = rolls({"p1": host(release=True)})
    assert got["problem"] == ("the engine release differs on p1 only, and no switch is recorded (%s): the hosts were "
                              "changed outside this playbook; run site.yml; no instance was touched." % JOURNAL)
    assert rolls({"p1": host(release=True)}, journal=switching())["problem"] is None  # a switch resumed


def test_a_release_without_a_staging_host_is_refused():
    one_each = {"decode-0": "d0", "prefill-0": "p0", "prefill-2": "p1"}
    got = rolls({h: host(release=True) for h in SERVING}, the_plan=plan(one_each))
    assert got["staging_host"] == "" and got["staging"] == []
    assert got["problem"].startswith("a new engine release needs a prefill host with two prefill instances and prefill "
                                     "instances on another host")
    every_prefill_on_p0 = {"decode-0": "d0", "prefill-0": "p0", "prefill-1": "p0"}
    got = rolls({h: host(release=True) for h in SERVING}, the_plan=plan(every_prefill_on_p0))
    assert got["staging_host"] == "p0" and got["problem"].startswith("a new engine release needs")


def test_a_refusal_names_what_fails_first():
    """A release with a maintenance turn left is refused for the turn, not for the staging host it has."""
    got = rolls({h: host(release=True, turn={"host": h} if h == "d0" else None) for h in SERVING})
    assert got["kind"] == "release" and got["problem"].startswith("the maintenance turn of d0 was interrupted")


def test_the_switch_names_each_hosts_instances_and_those_still_to_stop():
    # KILL_POINTS switch, resumed: p1 still runs the old release (both pending), d0's decode was stopped by the
    # killed run; the staging host's instances are the temporary decode's (vllm_instances).
    got = rolls({"p0": host(current="/opt/pdctl/venvs/vllm-" + NEW),
                 "p1": host(pending=["prefill-3", "prefill-2"], release=True),
                 "d0": host(pending=["decode-0"], stopped=["decode-0"], release=True)}, journal=switching())
    assert {h: names(i) for h, i in got["host_instances"].items()} == {
        "d0": ["decode-0"], "p0": ["prefill-0", "prefill-1"], "p1": ["prefill-2", "prefill-3"]}
    # In the plan's order, whatever order the host reported them in.
    pending = {h: names(i) for h, i in got["host_pending"].items()}
    assert pending == {"d0": ["decode-0"], "p0": [], "p1": ["prefill-2", "prefill-3"]}
    assert got["switch_to"] == ""
    back = rolls({"p1": host(release=True)}, target=OLD, rolling_back=True, journal=switching(state="rolling-back"))
    assert back["switch_to"] == OLD


# ---------------------------------------------------------------- rolled_summary: the line a pass ends with

def test_a_pass_ends_saying_what_it_rolled():
    assert rolls({})["rolled_summary"] == ("0 instance(s) rolled (none), in batches: the standby routed to every other "
                                           "instance while a batch was out")
    assert rolls({"p1": host(pending=["prefill-3", "prefill-2"]), "d0": host(pending=["decode-0"])})["rolled_summary"] == (
        "3 instance(s) rolled (decode-0, prefill-2, prefill-3), in batches: the standby routed to every other instance "
        "while a batch was out, a temporary decode served while the decode restarted")


def test_a_release_pass_ends_saying_every_instance_runs_the_target():
    got = rolls({h: host(pending=[n for n, where in HOSTS.items() if where == h], release=True) for h in SERVING},
                target=OLD, rolling_back=True)
    assert got["rolled_summary"] == "every instance runs %s; no request was paired across releases" % OLD


# ---------------------------------------------------------------- verdict(): after the gates, back or not

GATES_FAILED = "SLA: failed (mean TPOT 11 ms > 1 ms)"
ROLLOUT = {"state": "rolling", "target": "cfg-new", "reason": "", "previous": {"pdctl_engine": {}}}


def verdict(kind="release", rolling_back=False, journal=None, reason="", target=NEW, gated=False, rollout_rollback=False,
            rollout=None, passed=True, check_mode=False):
    return ud.verdict(kind, rolling_back, switching() if journal is None else journal, reason, target, gated,
                      rollout_rollback, ROLLOUT if rollout is None else rollout, "cfg-new", passed,
                      "" if passed else GATES_FAILED, check_mode)


def test_a_release_that_passes_the_gates_stays():
    got = verdict()
    assert not got["rollback_now"] and not got["rollout_rollback_now"]
    assert (got["rolling_back"], got["reason"], got["target_release"]) == (False, "", NEW)


def test_a_release_that_fails_the_gates_goes_back_to_the_release_before_the_switch():
    got = verdict(passed=False)
    assert got["rollback_now"] and got["rolling_back"] and got["target_release"] == OLD
    assert got["reason"] == "the gates failed on %s: %s" % (NEW, GATES_FAILED)
    assert not got["rollout_rollback_now"] and got["rollout_reason"] == ""


def test_a_switch_resumed_from_its_record_fails_the_gates_and_goes_back():
    # KILL_POINTS switch or late: the resumed pass ends with the gates like the first one.
    got = verdict(journal=switching(since="2026-12-02T00:00:00+00:00"), passed=False)
    assert got["rollback_now"] and got["target_release"] == OLD


def test_a_rollback_that_fails_the_gates_does_not_roll_back_again():
    # KILL_POINTS rollback, resumed (the record says rolling-back), or `pdctl rollback`: one way back only.
    got = verdict(rolling_back=True, journal=switching(state="rolling-back"), reason="the gates failed on x: y",
                  target=OLD, passed=False)
    assert not got["rollback_now"] and got["rolling_back"] and got["reason"] == "the gates failed on x: y"


def test_check_mode_never_rolls_back():
    assert not verdict(passed=False, check_mode=True)["rollback_now"]
    assert not verdict(kind="compatible", gated=True, passed=False, check_mode=True)["rollout_rollback_now"]


def test_a_compatible_change_never_switches_back_a_release():
    got = verdict(kind="compatible", passed=False)
    assert not got["rollback_now"] and not got["rollout_rollback_now"]  # not gated: the gates did not judge it


def test_a_prefill_change_that_fails_the_gates_goes_back_to_the_configuration_before_it():
    got = verdict(kind="compatible", gated=True, passed=False)
    assert got["rollout_rollback_now"] and got["rollout_rollback"] and not got["rollback_now"]
    assert got["rollout_reason"] == "the gates failed: %s" % GATES_FAILED
    assert got["rollout"] == dict(ROLLOUT, target="cfg-new", state="rolling-back", reason=got["rollout_reason"])
    assert ROLLOUT["state"] == "rolling"  # the record given is not changed in place


def test_a_prefill_rollback_that_fails_the_gates_does_not_roll_back_again():
    back = dict(ROLLOUT, state="rolling-back", reason="requested (pdctl rollback)")
    got = verdict(kind="compatible", gated=True, rollout_rollback=True, rollout=back, passed=False)
    assert not got["rollout_rollback_now"] and got["rollout"] == back


# ---------------------------------------------------------------- outcome(): how the run ends

def outcome(kind="release", rolling_back=False, journal=None, reason="", target=NEW, gated=False,
            rollout_rollback=False, rollout=None, requested=False, pending=(), passed=True, check_mode=False):
    return ud.outcome(kind, rolling_back, switching() if journal is None else journal, reason, target, gated,
                      rollout_rollback, ROLLOUT if rollout is None else rollout, "cfg-new", requested,
                      [{"name": n} for n in pending], passed, "SLA: passed" if passed else GATES_FAILED, check_mode)


def test_a_switch_that_passed_is_accepted():
    got = outcome()
    assert got["ok"] and got["journal_state"] == "accepted"
    assert (got["rollout_state"], got["rollout_target"], got["rollout_reason"]) == ("accepted", "cfg-new", "")
    assert got["msg"] == "Every instance runs %s; the gates passed (SLA: passed). " % NEW
    assert got["report"] == {"verdict": "accepted", "rolled_back": False, "passed": True, "reason": "",
                             "kind": "release", "target_release": NEW}


def test_a_switch_the_gates_rolled_back_fails_the_run_naming_why():
    reason = "the gates failed on %s: %s" % (NEW, GATES_FAILED)
    got = outcome(rolling_back=True, journal=switching(state="rolling-back", reason=reason), reason=reason,
                  target=OLD)
    assert not got["ok"] and got["journal_state"] == "rolled-back" and got["rollout_state"] is None
    # benchmarks/upgrade.py reads these words.
    assert got["msg"] == ("Upgrade rolled back: %s. Every instance runs %s again; the gates after the rollback "
                          "passed. " % (reason, OLD))
    assert got["report"] == {"verdict": "rejected", "rolled_back": True, "passed": True, "reason": reason,
                             "kind": "release", "target_release": OLD}


def test_a_rollback_the_gates_fail_too_leaves_the_record_rolling_back():
    reason = "the gates failed on %s: x" % NEW
    got = outcome(rolling_back=True, journal=switching(state="rolling-back"), reason=reason, target=OLD, passed=False)
    # A rollback is recorded as finished whatever the gates said (it is as far back as it goes).
    assert not got["ok"] and got["journal_state"] == "rolled-back"
    assert got["msg"].endswith("the gates after the rollback FAILED too: %s. " % GATES_FAILED)


def test_a_failed_switch_in_check_mode_records_nothing():
    got = outcome(passed=True, check_mode=True)
    assert got["ok"] and got["journal_state"] is None and got["rollout_state"] is None
    assert got["msg"] == ("Check mode: nothing changed; the steps above are what a run would take  (the gates were "
                          "not measured). ")
    assert got["report"]["verdict"] == "check" and not got["report"]["rolled_back"]
    back = outcome(rolling_back=True, reason=ud.REQUESTED, target=OLD, check_mode=True)
    assert back["ok"] and "would take back to %s (the gates" % OLD in back["msg"]


def test_a_requested_rollback_passes_when_the_gates_pass():
    got = outcome(rolling_back=True, journal=switching(state="rolling-back"), reason=ud.REQUESTED, target=OLD)
    assert got["ok"] and got["journal_state"] == "rolled-back"
    assert got["msg"] == "Rolled back on request: every instance runs %s again, the gates passed (SLA: passed)." % OLD
    assert got["report"]["verdict"] == "rolled-back" and got["report"]["reason"] == ud.REQUESTED
    failed = outcome(rolling_back=True, journal=switching(state="rolling-back"), reason=ud.REQUESTED, target=OLD,
                     passed=False)
    assert not failed["ok"] and failed["msg"] == "Rolled back on request to %s, but the gates failed again: %s " % (
        OLD, GATES_FAILED)


def test_a_switch_the_gates_failed_in_the_same_run_leaves_the_record_switching():
    # verdict() had no time to roll back (check mode aside, it always does); nothing is recorded as accepted.
    got = outcome(passed=False)
    assert got["journal_state"] is None and got["rollout_state"] is None


def test_a_finished_switch_is_not_recorded_again():
    for state in ("accepted", "rolled-back", "none"):
        assert outcome(journal={} if state == "none" else switching(state=state))["journal_state"] is None


def test_a_prefill_change_the_gates_rolled_back_fails_the_run_and_records_the_change_rolled_back():
    back = dict(ROLLOUT, state="rolling-back", reason="the gates failed: %s" % GATES_FAILED)
    got = outcome(kind="compatible", gated=True, rollout_rollback=True, rollout=back, journal={}, pending=["prefill-2"])
    assert not got["ok"] and got["journal_state"] is None
    assert (got["rollout_state"], got["rollout_target"], got["rollout_reason"]) == ("rolled-back", "cfg-new",
                                                                                    back["reason"])
    assert got["msg"] == ("Upgrade rolled back: %s (prefill configuration cfg-new). Every prefill instance runs its "
                          "configuration before the change again; the gates after the rollback passed. " % back["reason"])
    assert got["report"]["verdict"] == "rejected" and got["report"]["reason"] == back["reason"]


def test_a_requested_prefill_rollback():
    back = dict(ROLLOUT, state="rolling-back", reason=ud.REQUESTED)
    got = outcome(kind="compatible", gated=True, rollout_rollback=True, rollout=back, requested=True, journal={})
    assert got["ok"] and got["msg"] == ("Rolled back on request: the prefill instances run their configuration before "
                                        "cfg-new again, the gates passed (SLA: passed).")
    failed = outcome(kind="compatible", gated=True, rollout_rollback=True, rollout=back, requested=True, journal={},
                     passed=False)
    assert not failed["ok"] and failed["rollout_state"] is None
    assert failed["msg"] == ("Rolled back on request from the prefill configuration cfg-new, but the gates failed "
                             "again: %s " % GATES_FAILED)


def test_a_compatible_change_counts_what_it_rolled():
    got = outcome(kind="compatible", journal={}, pending=["prefill-2", "prefill-3"])
    assert got["ok"] and got["msg"] == "2 instance(s) rolled in batches."
    gated = outcome(kind="compatible", gated=True, journal={}, pending=["prefill-2"])
    assert gated["msg"] == "1 instance(s) rolled in batches; the gates passed (SLA: passed)."
    assert gated["rollout_state"] == "accepted" and gated["report"]["verdict"] == "accepted"


def test_a_retried_release_that_passes_is_accepted_like_any_switch():
    # -e upgrade_retry=true: target() let the rolled-back release through; the new switch record says switching.
    got = outcome(journal=switching(since="2026-12-03T00:00:00+00:00"))
    assert got["ok"] and got["journal_state"] == "accepted" and got["report"]["verdict"] == "accepted"


def test_a_rollback_the_gates_asked_for_resumed_in_check_mode_is_still_rejected():
    # KILL_POINTS rollback, then `pdctl upgrade --check`: the run fails as the rollback's would (pdctl exits 3).
    reason = "the gates failed on %s: x" % NEW
    got = outcome(rolling_back=True, journal=switching(state="rolling-back"), reason=reason, target=OLD, check_mode=True)
    assert not got["ok"] and got["journal_state"] is None and got["report"]["verdict"] == "rejected"
    assert not got["report"]["rolled_back"]  # nothing changed
    assert got["msg"].startswith("Upgrade rolled back: %s." % reason)


# ---------------------------------------------------------------- standing(): the one object the plays read

def test_the_runs_standing_is_what_target_and_the_prefill_decision_say():
    aim = ud.target([switching()], NEW)
    run = ud.standing(aim, ROLLOUT, "roll")
    assert run == {"journal": switching(), "rolling_back": False, "reason": "", "target_release": NEW,
                   "rollout": ROLLOUT, "rollout_rollback": False, "rollout_requested": False}
    # pdctl rollback: the release before the switch; pdctl rollback --prefill: the prefill change goes back.
    back = ud.standing(ud.target([switching(state="accepted")], NEW, rollback=True), {}, None)
    assert back["rolling_back"] and back["target_release"] == OLD and back["reason"] == ud.REQUESTED
    prefill = ud.standing(ud.target([], NEW, rollback="prefill"), ROLLOUT, "rollback")
    assert prefill["rollout_rollback"] and prefill["rollout_requested"] and not prefill["rolling_back"]


def test_a_resumed_rollback_stands_where_the_record_says():
    # KILL_POINTS rollback: the record says rolling-back, its reason is the gates'; the run aims at the old release.
    reason = "the gates failed on %s: x" % NEW
    run = ud.standing(ud.target([switching(state="rolling-back", reason=reason)], NEW), {}, None)
    assert run["rolling_back"] and run["reason"] == reason and run["target_release"] == OLD


def test_the_verdict_moves_the_runs_standing_on():
    run = ud.standing(ud.target([switching()], NEW), ROLLOUT, "roll")
    kept = ud.verdict_of("release", run, False, "cfg-new", True, "", False)
    assert not kept["rollback_now"] and kept["run"] == run
    failed = ud.verdict_of("release", run, False, "cfg-new", False, GATES_FAILED, False)
    moved = dict(run, rolling_back=True, target_release=OLD, reason="the gates failed on %s: %s" % (NEW, GATES_FAILED))
    assert failed["rollback_now"] and failed["run"] == moved
    # The same as verdict() on the fields it names.
    assert {k: v for k, v in failed.items() if k != "run"} == ud.verdict(
        "release", False, switching(), "", NEW, False, False, ROLLOUT, "cfg-new", False, GATES_FAILED, False)
    prefill = ud.verdict_of("compatible", dict(run, journal={}), True, "cfg-new", False, GATES_FAILED, False)
    assert prefill["rollout_rollback_now"] and prefill["run"]["rollout_rollback"]
    assert prefill["run"]["rollout"] == dict(ROLLOUT, state="rolling-back", reason="the gates failed: " + GATES_FAILED)


def test_the_outcome_reads_the_runs_standing():
    run = ud.standing(ud.target([switching()], NEW), ROLLOUT, "roll")
    got = ud.outcome_of("release", run, False, "cfg-new", [], True, "SLA: passed", False)
    assert got == outcome()
    back = ud.verdict_of("release", run, False, "cfg-new", False, GATES_FAILED, False)["run"]
    back["journal"] = dict(back["journal"], state="rolling-back")
    got = ud.outcome_of("release", back, False, "cfg-new", [], True, "SLA: passed", False)
    assert not got["ok"] and got["journal_state"] == "rolled-back" and got["report"]["verdict"] == "rejected"
