# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Host maintenance's decisions (plugins/module_utils/maintenance_decide.py) on host states, at each point a run
resumes from: a host left half-done, a decode turn's record, a temporary decode up, a host that failed its
checks before. The plan is a small one written here: three prefill hosts (two instances each, one of them with
prefill-10 to show the name order), one decode host; routers on two prefill hosts."""
from __future__ import annotations

import pytest

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import maintenance_decide as md
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import rollout_plan as rp

DRIVER = "580.95.05"
TURN_FILE = "/var/lib/pdctl/maintenance-turn.json"


def _inst(name, host, pool, port, gpus):
    return {"name": name, "host": host, "pool": pool, "url": "http://%s:%d" % (host, port), "gpus": gpus,
            "unit": "pdctl-vllm-%s.service" % name, "api_port": port}


PLAN = {
    "instances": [_inst("prefill-0", "p0", "prefill", 8100, [0, 1, 2, 3]), _inst("prefill-1", "p0", "prefill", 8101, [4, 5, 6, 7]),
                  _inst("prefill-2", "p1", "prefill", 8100, [0, 1, 2, 3]), _inst("prefill-10", "p1", "prefill", 8101, [4, 5, 6, 7]),
                  _inst("prefill-9", "p2", "prefill", 8100, [0, 1, 2, 3]), _inst("decode-0", "d0", "decode", 8200, list(range(8)))],
    "routers": [{"host": "p0"}, {"host": "p1"}],
    "frontdoor": {"hosts": ["p0", "p1"], "vip": {"address": "10.0.0.100"}},
}
GROUPS = {"prefill": ["p0", "p1", "p2"], "decode": ["d0"], "serving": ["p0", "p1", "p2", "d0"],
          "router": ["p0", "p1"], "frontdoor": ["p0", "p1"]}


def lines(module=DRIVER, packages=("nvidia-driver-580 %s-0ubuntu1" % DRIVER,), units=(), turn=None, reboot=None):
    out = ["module %s" % module] + ["package %s" % p for p in packages]
    out += ["unit %s %s" % u for u in units]
    if turn is not None:
        out.append("turn %s" % turn)
    if reboot is not None:
        out.append("reboot %s" % reboot)
    return out


# ---------------------------------------------------------------- read(): what is left on one host


def test_a_host_on_the_manifests_driver_with_its_instances_up_has_nothing_left():
    state = md.read(lines(units=[("pdctl-vllm-prefill-0.service", "active")]), DRIVER, TURN_FILE, PLAN, "p0")
    assert state == {"todo": [], "instances_down": [], "reboot_required": False, "reboot_needs": []}


def test_a_host_on_another_driver_names_the_module_and_the_other_releases_packages():
    state = md.read(lines(module="570.1", packages=["nvidia-driver-570 570.1-0ubuntu1", "libnvidia-compute-580 %s-1" % DRIVER]),
                    DRIVER, TURN_FILE)
    assert state["todo"] == ["NVIDIA kernel module 570.1 loaded, %s in the manifest" % DRIVER,
                             "package nvidia-driver-570 570.1-0ubuntu1"]
    assert "reboot_needs" not in state   # without the plan


def test_no_module_loaded_is_something_to_do():
    assert md.read(["package x %s-1" % DRIVER], DRIVER, TURN_FILE)["todo"] == [
        "NVIDIA kernel module none loaded, %s in the manifest" % DRIVER]


def test_instances_not_active_are_down_and_left_to_do():
    # A run interrupted between the stop and the start: inactive (not "active") and failed instances.
    state = md.read(lines(units=[("pdctl-vllm-prefill-0.service", "inactive"), ("pdctl-vllm-prefill-1.service", "active"),
                                 ("pdctl-vllm-prefill-2.service", "failed")]), DRIVER, TURN_FILE)
    assert state["instances_down"] == ["unit pdctl-vllm-prefill-0.service inactive", "unit pdctl-vllm-prefill-2.service failed"]
    assert state["todo"] == ["instance pdctl-vllm-prefill-0.service inactive", "instance pdctl-vllm-prefill-2.service failed"]


def test_a_decode_turns_record_left_by_an_interrupted_run_is_a_turn_to_finish():
    state = md.read(lines(units=[("pdctl-vllm-decode-0.service", "active")],
                          turn='{"host": "d0", "lender": "prefill-9", "since": "2026-01-01T00:00:00"}'), DRIVER, TURN_FILE)
    assert state["todo"] == ["an interrupted decode turn (%s)" % TURN_FILE] and not state["instances_down"]


@pytest.mark.parametrize("reboot, said", [("linux-image-6.8.0-50-generic ", "a reboot (/run/reboot-required: linux-image-6.8.0-50-generic)"),
                                          ("", "a reboot (/run/reboot-required)")])
def test_a_reboot_asked_for_names_the_packages_that_ask(reboot, said):
    state = md.read(lines(reboot=reboot), DRIVER, TURN_FILE, PLAN, "p2")
    assert state["todo"] == [said] and state["reboot_required"] and state["reboot_needs"] == []


def test_a_router_and_front_door_host_may_reboot_only_where_another_takes_over():
    assert md.read(lines(reboot="k"), DRIVER, TURN_FILE, PLAN, "p0")["reboot_needs"] == []
    alone = dict(PLAN, routers=[{"host": "p0"}], frontdoor={"hosts": ["p0"], "vip": None})
    assert md.read(lines(reboot="k"), DRIVER, TURN_FILE, alone, "p0")["reboot_needs"] == [
        "another router host", "a second front-door host behind a virtual address (pdctl_frontdoor_vip)"]
    no_vip = dict(PLAN, frontdoor={"hosts": ["p0", "p1"], "vip": None})
    assert md.read(lines(reboot="k"), DRIVER, TURN_FILE, no_vip, "p1")["reboot_needs"] == [
        "a second front-door host behind a virtual address (pdctl_frontdoor_vip)"]
    assert md.read(lines(), DRIVER, TURN_FILE, alone, "p0")["reboot_needs"] == []   # no reboot asked: nothing needed


# ---------------------------------------------------------------- order(): the turns


def _facts(todo=(), down=(), reboot=False):
    return {"maintenance_todo": list(todo), "maintenance_instances_down": list(down), "maintenance_reboot_required": reboot}


def test_prefill_hosts_go_first_and_the_decode_host_last():
    hostvars = {h: _facts(["x"]) for h in ["d0", "p0", "p1", "p2"]}
    assert md.order(GROUPS, hostvars, ["d0", "p0", "p1", "p2"]) == {"hosts": ["p0", "p1", "p2", "d0"],
                                                                    "reload_hosts": ["p0", "p1"]}


def test_a_host_with_nothing_to_do_takes_no_turn_and_a_second_run_none():
    hostvars = {"p0": _facts(), "p1": _facts(["x"]), "p2": _facts(), "d0": _facts()}
    assert md.order(GROUPS, hostvars, ["p0", "p1", "p2", "d0"])["hosts"] == ["p1"]
    done = {h: _facts() for h in hostvars}
    assert md.order(GROUPS, done, ["p0", "p1", "p2", "d0"])["hosts"] == []


def test_a_prefill_host_that_failed_its_checks_before_goes_first():
    # p2 was left out of service (quarantined) by an earlier run: its instances are down.
    hostvars = {"p0": _facts(["x"]), "p1": _facts(["x"]), "p2": _facts(["instance u inactive"], ["unit u inactive"]),
                "d0": _facts(["x"], ["unit d inactive"])}
    assert md.order(GROUPS, hostvars, ["p0", "p1", "p2", "d0"])["hosts"] == ["p2", "p0", "p1", "d0"]


def test_a_limited_run_takes_only_its_hosts():
    hostvars = {"p1": _facts(["x"]), "d0": _facts(["x"])}
    assert md.order(GROUPS, hostvars, ["d0", "p1"])["hosts"] == ["p1", "d0"]


def test_a_router_host_asked_to_reboot_does_not_reload():
    hostvars = {"p0": _facts(["x"], reboot=True), "p1": _facts(["x"]), "p2": _facts(), "d0": _facts()}
    assert md.order(GROUPS, hostvars, ["p0", "p1", "p2", "d0"])["reload_hosts"] == ["p1"]


def test_the_filter_reads_each_hosts_facts():
    hostvars = {h: _facts(["x"]) for h in ["p0", "d0"]}
    assert md.order(GROUPS, hostvars, ["p0", "d0"])["hosts"] == ["p0", "d0"]


# ---------------------------------------------------------------- turn(): one host's turn


def test_the_lender_is_the_last_prefill_instance_by_name():
    assert rp.lender(PLAN)["name"] == "prefill-9"   # by name as a string: prefill-10 < prefill-9
    assert rp.lender({"instances": [i for i in PLAN["instances"] if i["pool"] == "decode"]}) is None


def test_a_prefill_hosts_turn():
    turn = md.turn(PLAN, "p1", [], GROUPS, ["p0", "p1", "p2", "d0"])
    assert [i["name"] for i in turn["instances"]] == ["prefill-10", "prefill-2"]
    assert not turn["decode_turn"] and not turn["serves_nothing"] and turn["activation"] == "reload"
    assert [i["name"] for i in turn["carriers"]] == ["prefill-0", "prefill-1", "prefill-9"]
    assert turn["lender"]["name"] == "prefill-9"
    assert (turn["done"], turn["left"]) == (["p0"], ["p2", "d0"])
    assert md.turn(PLAN, "p2", [], GROUPS, ["p2"])["activation"] == "reboot"


def test_the_decode_hosts_turn_leaves_the_lender_out_of_the_carriers():
    turn = md.turn(PLAN, "d0", [], GROUPS, ["p0", "d0"])
    assert turn["decode_turn"] and turn["lender"]["name"] == "prefill-9" and turn["activation"] == "reboot"
    assert [i["name"] for i in turn["carriers"]] == ["prefill-0", "prefill-1", "prefill-2", "prefill-10"]
    assert (turn["done"], turn["left"]) == (["p0"], [])


def test_a_decode_turn_resumed_with_its_temporary_decode_up():
    # The run was killed once the temporary decode served and the decode had stopped: the decode host's read
    # shows its record and its decode down; it takes its turn last, as the decode turn again.
    state = md.read(lines(units=[("pdctl-vllm-decode-0.service", "inactive")], turn='{"host": "d0"}'), DRIVER, TURN_FILE)
    hostvars = {"p0": _facts(), "p1": _facts(), "p2": _facts(),
                "d0": {"maintenance_todo": state["todo"], "maintenance_instances_down": state["instances_down"]}}
    assert md.order(GROUPS, hostvars, ["p0", "p1", "p2", "d0"])["hosts"] == ["d0"]
    turn = md.turn(PLAN, "d0", state["instances_down"], GROUPS, ["d0"])
    assert turn["decode_turn"] and turn["serves_nothing"] and turn["lender"]["name"] == "prefill-9"


def test_a_host_whose_instances_are_all_down_serves_nothing():
    down = ["unit pdctl-vllm-prefill-2.service inactive", "unit pdctl-vllm-prefill-10.service failed"]
    assert md.turn(PLAN, "p1", down, GROUPS, ["p1"])["serves_nothing"]
    assert not md.turn(PLAN, "p1", down[:1], GROUPS, ["p1"])["serves_nothing"]


def test_a_decode_turn_names_a_plan_without_prefill():
    with pytest.raises(rp.PlanError, match="no prefill instance"):
        md.turn({"instances": [PLAN["instances"][-1]]}, "d0", [], GROUPS, ["d0"])


# ---------------------------------------------------------------- rescue(): a failed turn's membership


def _urls(*names):
    return [i["url"] for i in PLAN["instances"] if i["name"] in names]


def test_a_failed_prefill_turn_leaves_the_routers_without_its_instances():
    turn = md.turn(PLAN, "p0", [], GROUPS, ["p0"])
    got = md.rescue(PLAN, turn["instances"], turn["lender"], ["prefill-9"])
    assert got == {"temporary": False, "prefill_urls": _urls("prefill-2", "prefill-10", "prefill-9"),
                   "decode_urls": _urls("decode-0")}


def test_a_failed_decode_turn_keeps_the_temporary_decode_where_it_runs():
    turn = md.turn(PLAN, "d0", [], GROUPS, ["d0"])
    got = md.rescue(PLAN, turn["instances"], turn["lender"], ["decode-temporary"])
    assert got == {"temporary": True, "prefill_urls": _urls("prefill-0", "prefill-1", "prefill-2", "prefill-10"),
                   "decode_urls": _urls("prefill-9")}
    # Failed before the temporary decode started (or after it stopped): the lender is a prefill instance again.
    got = md.rescue(PLAN, turn["instances"], turn["lender"], ["prefill-9"])
    assert got == {"temporary": False, "prefill_urls": _urls("prefill-0", "prefill-1", "prefill-2", "prefill-10", "prefill-9"),
                   "decode_urls": []}


# ---------------------------------------------------------------- what a turn reads and moves


def test_a_prefill_turn_moves_its_urls_and_reads_only_its_instances_when_it_fails():
    turn = md.turn(PLAN, "p0", [], GROUPS, ["p0"])
    assert turn["urls"] == _urls("prefill-0", "prefill-1") and turn["router_host"]
    assert turn["probes"] == turn["instances"]
    assert not md.turn(PLAN, "p2", [], GROUPS, ["p2"])["router_host"]


def test_a_failed_decode_turn_reads_the_lender_and_the_temporary_decode_too():
    turn = md.turn(PLAN, "d0", [], GROUPS, ["d0"])
    assert [p["name"] for p in turn["probes"]] == ["decode-0", "prefill-9", "decode-temporary"]
    assert turn["probes"][-1] == {"name": "decode-temporary", "unit": "pdctl-vllm-decode-temporary.service", "host": "p2"}
    # What the probes say running, rescue() makes the routers' membership of (the temporary decode's name).
    assert md.rescue(PLAN, turn["instances"], turn["lender"], [turn["probes"][-1]["name"]])["temporary"]


# ---------------------------------------------------------------- failed(): the message a failed turn stops with

def test_a_failed_prefill_turn_names_the_host_the_task_and_the_hosts_done_and_left():
    turn = md.turn(PLAN, "p1", [], GROUPS, ["p0", "p1", "p2", "d0"])
    assert md.failed(turn, {"task": "GPUs match", "reason": "GPU 2 missing."}) == (
        "p1 is out of service: GPUs match: GPU 2 missing. Its instances (prefill-10, prefill-2) stay stopped and no "
        "router sends to them; hosts done: p0; not touched: p2, d0. Fix the host and run `pdctl maintain` again: it "
        "resumes with this host.")


def test_a_failed_decode_turn_says_the_temporary_decode_serves():
    turn = md.turn(PLAN, "d0", [], GROUPS, ["d0"])
    assert md.failed(turn, {"task": "T", "reason": "R"}) == (
        "d0 is out of service: T: R Its instances (decode-0) stay stopped and no router sends to them; the temporary "
        "decode serves in place of the decode; hosts done: none; not touched: none. Fix the host and run `pdctl "
        "maintain` again: it resumes with this host.")


# ---------------------------------------------------------------- summary(): what the run prints first


def test_a_run_with_nothing_to_do_says_so():
    assert md.summary([], {"p0": _facts()}, DRIVER) == {
        "todo": {}, "lines": ["Nothing to do: every host runs NVIDIA driver %s with its instances up." % DRIVER]}


def test_a_run_lists_each_hosts_todo_in_the_turns_order():
    hostvars = {"p1": {"maintenance_todo": ["package a", "a reboot (/run/reboot-required)"]},
                "d0": {"maintenance_todo": ["instance pdctl-vllm-decode-0.service inactive"]}}
    got = md.summary(["p1", "d0"], hostvars, DRIVER)
    assert got["lines"] == ["Hosts to maintain, one at a time, in this order (driver %s):" % DRIVER,
                            "p1: package a; a reboot (/run/reboot-required)",
                            "d0: instance pdctl-vllm-decode-0.service inactive"]
    assert got["todo"] == {"p1": hostvars["p1"]["maintenance_todo"], "d0": hostvars["d0"]["maintenance_todo"]}


# ---------------------------------------------------------------- carriers(): whether the host may leave


def test_a_host_leaves_only_while_enough_prefill_instances_of_the_others_serve():
    turn = md.turn(PLAN, "p1", [], GROUPS, ["p1"])
    assert md.carriers(turn, ["prefill-0"])["ok"]
    got = md.carriers(turn, ["prefill-0"], 2)
    assert not got["ok"] and got["serving"] == ["prefill-0"]
    assert got["msg"].startswith("p1 stays in service: while it is out, 1 prefill instance(s) would serve (prefill-0), "
                                 "fewer than 2 (pdctl_min_prefill_instances, default 1).")
    assert md.carriers(turn, [], 0)["msg"].count("(none), fewer than 1 ") == 1   # 0 counts as the default


def test_a_host_that_serves_nothing_leaves_whatever_the_others_do():
    down = ["unit pdctl-vllm-prefill-2.service inactive", "unit pdctl-vllm-prefill-10.service failed"]
    assert md.carriers(md.turn(PLAN, "p1", down, GROUPS, ["p1"]), [])["ok"]
