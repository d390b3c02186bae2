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


def rolls(hosts, journal=None, target=NEW, rolling_back=False, the_plan=None):
    the_plan = the_plan or plan()
    reports = {h: hosts.get(h) or host() for h in SERVING}
    return ud.rolls(the_plan["instances"], the_plan["routers"], SERVING, reports, journal or {}, target, rolling_back,
                    JOURNAL, TURN)


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
    assert got["summary"] == "0 instance(s) to roll one at a time: none, nothing to do"


def test_a_prefill_flag_change_rolls_those_instances_one_at_a_time():
    got = rolls({"p1": host(pending=["prefill-3", "prefill-2"])})
    assert got["problem"] is None and got["kind"] == "compatible"
    assert names(got["prefill_roll"]) == ["prefill-2", "prefill-3"] and got["decode_roll"] == []
    assert got["summary"] == "2 instance(s) to roll one at a time: prefill-2, prefill-3"


def test_a_decode_change_rolls_behind_a_temporary_decode_on_the_last_prefill_instance():
    got = rolls({"d0": host(pending=["decode-0"])})
    assert got["problem"] is None and names(got["decode_roll"]) == ["decode-0"] and not got["decode_resumed"]
    assert got["lender"]["name"] == "prefill-3" == rp.lender(plan())["name"]
    assert got["summary"] == ("1 instance(s) to roll one at a time: decode-0; the decode behind a temporary decode on "
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
    assert got["summary"] == ("1 instance(s) to roll one at a time: decode-0; the decode behind a temporary decode on "
                              "prefill-3's GPUs (resumed)")


def test_a_decode_change_killed_while_the_lender_starts_again_still_finishes_the_turn():
    got = rolls({"d0": host(turn={"host": "d0", "lender": "prefill-3", "by": "upgrade"}),
                 "p1": host(pending=["prefill-3"])})
    assert got["problem"] is None and names(got["decode_roll"]) == ["decode-0"] and got["pending"] == []
    assert got["rolled"] == ["decode-0"]
    assert got["summary"] == ("0 instance(s) to roll one at a time: none, nothing to do; the decode behind a temporary "
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
