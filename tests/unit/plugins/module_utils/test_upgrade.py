# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""module_utils/upgrade: what changed between the deployed and the target state, and the steps that
roll it out (run by `ansible-test units` and by pytest)."""
from __future__ import annotations

import copy

import pytest

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import upgrade
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.upgrade import UpgradeError

STEP_KEYS = {"action", "host", "instance", "router", "release", "workers", "why"}


def state(release="0.33.0", router_version="0.1.17"):
    """The production shape: two prefill instances on each of two hosts, one decode on the third."""
    instances = []
    for host, names in (("h1", ("prefill-0", "prefill-1")), ("h2", ("prefill-2", "prefill-3"))):
        for n, name in enumerate(names):
            instances.append({"name": name, "host": host, "pool": "prefill", "release": release,
                              "argv": ["vllm", "serve", "/m", "--port", str(8100 + n)],
                              "environment": {"CUDA_VISIBLE_DEVICES": "0,1,2,3" if n == 0 else "4,5,6,7"}})
    instances.append({"name": "decode-0", "host": "h3", "pool": "decode", "release": release,
                      "argv": ["vllm", "serve", "/m", "--port", "8200"], "environment": {}})
    return {"instances": instances,
            "router": {"host": "h1", "version": router_version, "argv": ["vllm-router", "--port", "30000"]}}


def inst(s, name):
    return next(i for i in s["instances"] if i["name"] == name)


def actions(steps, name=None):
    return [(s["action"], s["instance"], s["router"]) for s in steps if name is None or s["instance"] == name]


def test_nothing_changed_is_none_with_no_steps():
    p = upgrade.plan(state(), state())
    assert p["kind"] == "none" and p["steps"] == [] and p["min_prefill_in_service"] == 4 == p["prefill_total"]


def test_a_prefill_flag_change_rolls_one_instance_at_a_time_and_keeps_n_minus_1():
    target = state()
    for i in target["instances"]:
        if i["pool"] == "prefill":
            i["argv"] = i["argv"] + ["--max-num-seqs", "64"]
    p = upgrade.plan(state(), target)
    assert p["kind"] == "compatible" and p["changes"]["instances"] == {n: ["argv"] for n in
                                                                       ("prefill-0", "prefill-1", "prefill-2", "prefill-3")}
    assert p["min_prefill_in_service"] == 3 and p["prefill_total"] == 4
    steps = p["steps"]
    assert all(set(s) == STEP_KEYS and s["why"] for s in steps)
    # Each instance: out of rotation, drained, restarted, ready, canary, back, before the next one starts.
    per_instance = ["router_remove", "wait_drained", "restart", "wait_ready", "canary", "router_add"]
    assert [s["action"] for s in steps] == per_instance * 4
    assert [s["instance"] for s in steps[::6]] == ["prefill-0", "prefill-1", "prefill-2", "prefill-3"]
    assert {s["router"] for s in steps if s["action"].startswith("router_")} == {"primary"}
    assert not any(s["action"] in ("start_router", "switch_frontdoor", "stage_release") for s in steps)


def test_the_environment_and_decode_change_prefill_first_and_decode_through_a_temporary_decode():
    target = state()
    inst(target, "decode-0")["environment"] = {"UCX_TLS": "rc,cuda_copy"}
    inst(target, "prefill-2")["environment"] = dict(inst(target, "prefill-2")["environment"], UCX_TLS="rc")
    p = upgrade.plan(state(), target)
    assert p["kind"] == "compatible"
    assert p["changes"]["instances"] == {"decode-0": ["environment"], "prefill-2": ["environment"]}
    steps = p["steps"]
    first_decode = next(n for n, s in enumerate(steps) if s["instance"] == "decode-0")
    assert all(s["instance"] != "prefill-2" for s in steps[first_decode:]) and steps[0]["instance"] == "prefill-2"
    # The decode restarts only while a temporary decode serves, on a prefill instance's GPUs.
    seq = [(s["action"], s["instance"]) for s in steps[6:]]
    assert seq.index(("router_add", upgrade.TEMP_DECODE)) < seq.index(("router_remove", "decode-0")) \
        < seq.index(("restart", "decode-0")) < seq.index(("router_add", "decode-0")) \
        < seq.index(("router_remove", upgrade.TEMP_DECODE)) < seq.index(("start", "prefill-3"))
    tmp = next(s for s in steps if s["action"] == "start_temporary_decode")
    assert tmp["host"] == "h2" and tmp["release"] == "0.33.0"
    assert p["min_prefill_in_service"] == 3  # the lender is the only prefill out


def test_a_router_change_swaps_through_a_second_router():
    p = upgrade.plan(state(), state(router_version="0.1.18"))
    assert p["kind"] == "compatible" and p["changes"] == {"instances": {}, "router": ["version"]}
    assert [(s["action"], s["router"]) for s in p["steps"]] == [
        ("start_router", "second"), ("wait_ready", "second"), ("switch_frontdoor", "second"),
        ("wait_drained", "primary"), ("restart_router", "primary"), ("wait_ready", "primary"),
        ("switch_frontdoor", "primary"), ("wait_drained", "second"), ("stop_router", "second")]
    assert p["steps"][0]["workers"] == ["prefill-0", "prefill-1", "prefill-2", "prefill-3", "decode-0"]
    assert p["min_prefill_in_service"] == 4


def test_a_release_change_is_the_two_pool_switch():
    p = upgrade.plan(state(), state(release="0.34.0"))
    assert p["kind"] == "release" and (p["from_release"], p["to_release"]) == ("0.33.0", "0.34.0")
    steps = p["steps"]
    assert all(set(s) == STEP_KEYS and s["why"] for s in steps)
    # Staging first, on every host, before anything stops.
    assert [(s["action"], s["host"]) for s in steps[:3]] == [("stage_release", h) for h in ("h1", "h2", "h3")]
    first_stop = next(n for n, s in enumerate(steps) if s["action"] == "stop")
    assert all(s["action"] in ("stage_release", "router_remove", "wait_drained") for s in steps[:first_stop])
    # The second router starts with only new-release instances, is gated, then takes the front door.
    start = next(s for s in steps if s["action"] == "start_router")
    assert start["router"] == "second" and start["workers"] == ["prefill-0", upgrade.TEMP_DECODE]
    order = [(s["action"], s["router"]) for s in steps if s["instance"] is None]  # router-level steps
    assert order.index(("gate", "second")) < order.index(("switch_frontdoor", "second")) \
        < order.index(("wait_drained", "primary"))
    # Never a request across releases: no old-release instance is ever in the second router, and no
    # new-release instance is added to the first one (it only comes back through restart_router).
    new = set()
    for s in steps:
        if s["action"] in ("start", "start_temporary_decode"):
            assert s["release"] == "0.34.0"
            new.add(s["instance"])
        if s["action"] == "router_add":
            assert s["router"] == "second" and s["instance"] in new
        if s["action"] == "start_router":
            assert set(s["workers"]) <= new
    # Every instance ends on the new release; the first router is back with all of them; gates last.
    assert {s["instance"] for s in steps if s["action"] == "start"} == {i["name"] for i in state()["instances"]}
    assert steps[-1]["action"] == "gate" and steps[-1]["router"] == "primary"
    restart = next(s for s in steps if s["action"] == "restart_router")
    assert restart["workers"] == ["prefill-0", "prefill-1", "prefill-2", "prefill-3", "decode-0"]
    assert p["min_prefill_in_service"] == 1  # the new pool starts with one prefill (the design)


def test_rollback_is_the_plan_back_to_the_recorded_state():
    p = upgrade.rollback_plan(state(release="0.34.0"), state())
    assert p["kind"] == "release" and p["rollback"] is True
    assert (p["from_release"], p["to_release"]) == ("0.34.0", "0.33.0")
    assert all(s["why"].startswith("rollback: ") for s in p["steps"])
    assert {s["release"] for s in p["steps"] if s["action"] == "start"} == {"0.33.0"}
    forward = copy.deepcopy(state())
    forward["instances"][0]["argv"] = forward["instances"][0]["argv"] + ["--x"]
    back = upgrade.rollback_plan(forward, state())
    assert back["kind"] == "compatible" and back["changes"]["instances"] == {"prefill-0": ["argv"]}
    assert upgrade.rollback_plan(state(), state())["steps"] == []


def test_the_replay_refuses_a_stop_while_a_router_still_sends():
    steps = [upgrade._step("stop", "x", "h1", "prefill-0")]
    with pytest.raises(UpgradeError, match="primary router still sends"):
        upgrade.prefill_in_service(steps, state())
    out = [upgrade._step("router_remove", "x", "h1", "prefill-0", "primary"),
           upgrade._step("router_remove", "x", "h1", "prefill-1", "primary")]
    assert upgrade.prefill_in_service(out, state()) == 2


def _broken(mutate):
    s = state()
    mutate(s)
    return s


@pytest.mark.parametrize("deployed, target, message", [
    ([], state(), "deployed state must be a dict"),
    ({"instances": []}, state(), "instances must be a non-empty list"),
    (_broken(lambda s: s["instances"][0].pop("argv")), state(), "deployed instance prefill-0: missing argv"),
    (_broken(lambda s: s["instances"][0].update(pool="encode")), state(), "pool must be one of prefill, decode"),
    (_broken(lambda s: s["instances"][1].update(name="prefill-0")), state(), "prefill-0: name given twice"),
    (_broken(lambda s: s["instances"][0].update(argv="vllm serve")), state(), "argv must be a non-empty list"),
    (_broken(lambda s: s["instances"][0].update(environment={"A": 1})), state(), "environment must be a dict of strings"),
    (_broken(lambda s: s.update(extra=1)), state(), "unknown keys extra"),
    (_broken(lambda s: s["router"].pop("version")), state(), "router.version must be a non-empty string"),
    (_broken(lambda s: s.update(instances=[i for i in s["instances"] if i["pool"] == "prefill"])), state(),
     "deployed state has no decode instance"),
    (state(), _broken(lambda s: s["instances"][0].update(release="0.34.0")), "target state mixes engine releases"),
    (state(), _broken(lambda s: s["instances"].pop(0)), "prefill-0 is deployed but not in the target"),
    (state(), _broken(lambda s: s["instances"][0].update(host="h9")), "prefill-0 moves host h1 -> h9"),
    (state(), _broken(lambda s: s["router"].update(host="h2")), "router moves host"),
])
def test_bad_input_is_refused_with_a_clear_error(deployed, target, message):
    with pytest.raises(UpgradeError, match=message):
        upgrade.plan(deployed, target)


def test_a_plan_that_cannot_keep_serving_is_refused():
    one_host = _broken(lambda s: s.update(instances=[i for i in s["instances"] if i["host"] != "h2"]))
    with pytest.raises(UpgradeError, match="needs prefill instances on a second host"):
        upgrade.plan(one_host, _broken(lambda s: [i.update(release="0.34.0") for i in s["instances"]]
                                       and s.update(instances=[i for i in s["instances"] if i["host"] != "h2"])))
    lonely = _broken(lambda s: s.update(instances=[i for i in s["instances"] if i["name"] in ("prefill-0", "decode-0")]))
    target = copy.deepcopy(lonely)
    target["instances"][1]["argv"] = target["instances"][1]["argv"] + ["--x"]
    with pytest.raises(UpgradeError, match="needs one of two or more prefill instances"):
        upgrade.plan(lonely, target)
