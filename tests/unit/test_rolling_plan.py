# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""module_utils/rollout_plan.py: the steps of a rollout, the capacity at each, the estimate from the timing
model; on small plans built here (not an inventory), and `pdctl upgrade/maintain --plan`."""
from __future__ import annotations

import pytest
import yaml

from inventories import group_var
from pdctl import collection

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import rollout_plan as rp
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.rollout_plan import PlanError

ROOT = collection.root()
# Distinct powers of two: a step's seconds tell which parts it counted.
TIMING = {"run_s": 1, "release_stage_s": 2, "router_ready_s": 4, "frontdoor_s": 8, "drain_s": 16,
          "drain_bound_s": 1016, "engine_stop_s": 32, "engine_ready_s": 64, "canary_s": 128, "gates_s": 256,
          "host_stack_s": 512, "reboot_s": 2048, "module_reload_s": 4096, "kv_path_s": 8192}


def inst(name, host, pool, gpus):
    return {"name": name, "host": host, "pool": pool, "gpus": list(range(gpus))}


def plan(prefill_hosts=("p0", "p1"), per_host=2, decode_gpus=8):
    instances = [inst("decode-0", "d0", "decode", decode_gpus)]
    n = 0
    for host in prefill_hosts:
        for _ in range(per_host):
            instances.append(inst("prefill-%d" % n, host, "prefill", 4))
            n += 1
    return {"instances": instances}


def capacity(steps):
    return [(s["prefill_in_service"], s["decode_gpus_in_service"]) for s in steps]


def test_prefill_change_rolls_one_instance_at_a_time_at_n_minus_1():
    steps = rp.prefill_steps(plan(), TIMING)
    assert len(steps) == 1 + 3 * 4
    assert capacity(steps) == [(4, 8)] + [(3, 8), (3, 8), (4, 8)] * 4
    per_instance = (4 + 8 + 16) + (128 + 32 + 64 + 128) + (8 + 16)  # a canary before the restart and after
    assert rp.summary(steps)["seconds"] == 1 + 4 * per_instance
    # Each instance waits on its routers' streams (away) and the standby's (home): at the bound, 1000 s more each.
    assert rp.summary(steps)["bound_s"] == 1 + 4 * per_instance + 8 * 1000
    assert all(s["prefill_total"] == 4 and s["decode_gpus_total"] == 8 for s in steps)


@pytest.mark.parametrize("total, keep, size", [(4, 0.5, 2), (4, 1, 1), (4, 0.75, 1), (4, 0.7, 1), (4, 0, 4),
                                               (4, 0.25, 3), (80, 0.5, 40), (80, 0.9, 8), (3, 0.5, 1), (1, 0.5, 1)])
def test_a_batch_keeps_the_share_serving_and_at_least_one_moves(total, keep, size):
    assert rp.batch_size(total, keep) == size
    # What stays is never under the share (rounded up), unless a single instance has to move anyway.
    assert total - size >= min(total - 1, keep * total - 1e-9)


def test_batches_split_the_changing_instances_in_order():
    assert rp.batches("abcde", 4, 0.5) == [["a", "b"], ["c", "d"], ["e"]]
    assert rp.batches("ab", 4, 1) == [["a"], ["b"]]
    assert rp.batches([], 4, 0.5) == []


@pytest.mark.parametrize("keep", [-0.1, 1.5, "half", None])
def test_a_bad_keep_share_is_named(keep):
    with pytest.raises(PlanError, match="pdctl_rollout_prefill_keep must be"):
        rp.batch_size(4, keep)


def test_prefill_change_rolls_half_at_once_and_keeps_half():
    steps = rp.prefill_steps(plan(), TIMING, keep=0.5)
    assert len(steps) == 1 + 3 * 2
    assert capacity(steps) == [(4, 8)] + [(2, 8), (2, 8), (4, 8)] * 2
    assert steps[1]["what"].startswith("prefill-0, prefill-1 out") and "prefill-0, prefill-1; prefill-2, prefill-3" \
        in steps[0]["what"]
    # A batch restarts together: one stop and one load, a canary per instance before and after.
    per_batch = (4 + 8 + 16) + (2 * 128 + 32 + 64 + 2 * 128) + (8 + 16)
    assert rp.summary(steps)["seconds"] == 1 + 2 * per_batch


def test_prefill_change_only_for_the_pending_instances_and_gated():
    steps = rp.prefill_steps(plan(), TIMING, pending=["prefill-2"], gated=True)
    assert [s["what"].split(" ")[0] for s in steps[1:4]] == ["prefill-2"] * 3
    assert steps[-1]["seconds"] == 256 and "gates" in steps[-1]["what"]
    # Nothing pending: no step but the run's, no gates.
    assert len(rp.prefill_steps(plan(), TIMING, pending=[], gated=True)) == 1
    with pytest.raises(PlanError, match="decode-9"):
        rp.prefill_steps(plan(), TIMING, pending=["decode-9"])


def test_decode_change_rolls_behind_a_temporary_decode_on_the_last_prefill_instance():
    steps = rp.prefill_steps(plan(), TIMING, pending=["prefill-0", "decode-0"], gated=True)
    # prefill-0's three steps, then the decode's three: out (the lender's 4 GPUs serve as the decode), restart, back.
    assert capacity(steps) == [(4, 8), (3, 8), (3, 8), (4, 8), (3, 4), (3, 4), (4, 8), (4, 8)]
    assert "prefill-3" in steps[4]["what"] and steps[4]["what"].startswith("decode-0 out")
    # The restart: the decode's own idle check is its stop (the routers that sent to it drained at the move home).
    assert steps[5]["seconds"] == 128 + 32 + 64 + 128 and steps[5]["drains"] == 0
    assert "gates" in steps[-1]["what"]


def test_with_two_routers_a_temporary_decode_restarts_them_in_turn_and_a_prefill_roll_at_once():
    two = dict(plan(), routers=[{"host": "d0"}, {"host": "p0"}])
    steps = rp.prefill_steps(two, TIMING, pending=["prefill-0", "decode-0"])
    # roles/upgrade/tasks/instance.yml changes both routers in one task (4 s once).
    assert steps[1]["seconds"] == 4 + 8 + 16
    # traffic role, temporary_decode_in: two membership changes, each router host in turn (2 x 4 s each), front door
    # away (8 + 16), the lender stops, the temporary decode starts, a canary through each router (2 x 128), home.
    assert steps[4]["seconds"] == 2 * 4 + 8 + 16 + 32 + 64 + 2 * 4 + 2 * 128 + 8 + 16 and steps[4]["drains"] == 2
    # traffic role, temporary_decode_out, and the way home: two membership changes again, the lender's canary.
    assert steps[6]["seconds"] == 2 * 4 + 8 + 16 + 32 + 64 + 128 + 2 * 4 + 8 + 16
    # The decode host's maintenance turn takes the same way in and out.
    turn = rp.maintenance_steps(two, TIMING, hosts=["d0"])
    assert turn[1]["seconds"] == steps[4]["seconds"]
    assert turn[3]["seconds"] == 64 + 128 + steps[6]["seconds"]


def test_release_switch_capacity_dips_to_the_new_pair():
    steps = rp.release_steps(plan(), TIMING)
    assert capacity(steps) == [(4, 8), (2, 8), (2, 8), (1, 4), (1, 4), (1, 4), (3, 8), (3, 8), (4, 8), (4, 8)]
    # The old pool's hosts switch prefill first, the decode's last; each instance loads in turn.
    assert steps[4]["what"].startswith("p1 switches") and steps[5]["what"].startswith("d0 switches")
    assert steps[4]["seconds"] == 32 + 2 * (64 + 128) and steps[5]["seconds"] == 32 + 64 + 128
    assert "prefill-0 starts" in steps[2]["what"] and "prefill-1's GPUs" in steps[2]["what"]
    assert steps[-1]["seconds"] == 256
    assert sum(s["drains"] for s in steps) == 4
    assert "gates" not in rp.release_steps(plan(), TIMING, gated=False)[-1]["what"]


def test_release_switch_needs_a_staging_host_with_two_prefill_instances():
    assert rp.staging(plan(prefill_hosts=("b", "a")))[0] == "a"
    with pytest.raises(PlanError, match="two prefill instances"):
        rp.release_steps(plan(per_host=1), TIMING)


def test_maintenance_prefill_hosts_first_decode_host_last_with_a_temporary_decode():
    steps = rp.maintenance_steps(plan(), TIMING, reload_hosts=["d0"])
    assert [s["what"].split(" ")[0].rstrip(":") for s in steps[1:]] == \
        ["p0"] * 3 + ["p1"] * 3 + ["d0"] * 3 + ["the"]
    assert capacity(steps) == [(4, 8), (2, 8), (2, 8), (4, 8), (2, 8), (2, 8), (4, 8), (3, 4), (3, 4), (4, 8), (4, 8)]
    # Prefill hosts reboot, the decode host (router, front door) reloads the module.
    assert steps[2]["seconds"] == 32 + 512 + 2048 and steps[8]["seconds"] == 32 + 512 + 4096
    assert "prefill-3 leaves" in steps[7]["what"]
    only = rp.maintenance_steps(plan(), TIMING, hosts=["p1"])
    assert len(only) == 1 + 3 + 1 and "p1" in only[0]["what"] and "p0" not in only[0]["what"]
    assert len(rp.maintenance_steps(plan(), TIMING, hosts=[])) == 1


@pytest.mark.parametrize("change, message", [
    ({"gates_s": None}, "gates_s must be seconds"),
    ({"reboot_s": -1}, "reboot_s must not be negative"),
    ({"drain_s": 2000}, "drain_s (2000) is above drain_bound_s"),
    ({"drian_s": 1}, "drian_s is not a timing key"),
])
def test_a_bad_timing_model_is_named(change, message):
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rp.check_timing(dict(TIMING, **change))


def test_a_missing_timing_key_is_named_with_its_meaning():
    timing = dict(TIMING)
    del timing["engine_ready_s"]
    with pytest.raises(PlanError, match=r"engine_ready_s is missing \(an instance starts"):
        rp.steps("prefill", plan(), timing)
    with pytest.raises(PlanError, match="unknown rollout kind"):
        rp.steps("decode", plan(), TIMING)


def test_render_lists_each_step_with_capacity_and_the_estimate():
    lines = rp.render(rp.prefill_steps(plan(), TIMING, pending=["prefill-0"]), "T")
    assert lines[0] == "T"
    assert lines[2].startswith("  2. [prefill 3/4, decode GPUs 8/8] prefill-0 out")
    assert lines[-1].startswith("Estimated duration: 6 min 45 s (40 min 05 s if every one of the 2 drains")
    assert lines[-1].endswith("at least 3 prefill instance(s) and 8 decode GPUs")


@pytest.mark.parametrize("name", ["b300", "lab"])
def test_each_inventory_has_a_whole_timing_model(name):
    assert set(rp.check_timing(group_var(name, "pdctl_rollout_timing"))) == set(rp.TIMING_KEYS)


def test_pdctl_upgrade_plan_prints_without_hosts(capsys, tmp_path):
    from pdctl import cli
    out = tmp_path / "plan.json"
    assert cli.main(["upgrade", "-i", str(ROOT / "inventories" / "lab"), "--check", "--plan", "release",
                     "--json", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("Rollout plan: a new engine release")
    assert printed[-1].startswith("Estimated duration: ")
    doc = yaml.safe_load(out.read_text())
    assert doc["summary"]["min_prefill_in_service"] == 1 and len(doc["steps"]) == len(printed) - 2


def test_pdctl_upgrade_plan_decode_lends_a_prefill_instance(capsys, tmp_path):
    from pdctl import cli
    out = tmp_path / "plan.json"
    assert cli.main(["upgrade", "-i", str(ROOT / "inventories" / "lab"), "--check", "--plan", "decode",
                     "--json", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["summary"]["min_prefill_in_service"] == 3 and doc["summary"]["min_decode_gpus_in_service"] == 4
    assert "1 instance(s) to roll: decode-0" in capsys.readouterr().out
