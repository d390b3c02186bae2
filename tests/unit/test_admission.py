# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Admission follows capacity (issue 41): the rule (module_utils/admission.py), the limits each rollout step
prints, and the capacity each traffic move of the playbooks hands the front doors, templated here from the
playbooks' own expressions against the plan of the tests' production inventory (its three hosts: the figures
below are worked for them, tests/fixtures/inventories)."""
from __future__ import annotations

import pytest
import yaml

from inventories import B300 as B300_INVENTORY, ROOT
from pdctl import cli, inventory

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import admission as adm
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import rollout_plan as rp
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.admission import AdmissionError

B300 = inventory.plan(B300_INVENTORY)
FULL = {"inflight": 64, "queue": 128}


def cap(prefill, decode_gpus, prefill_total=4, decode_gpus_total=8):
    return {"prefill_in_service": prefill, "prefill_total": prefill_total, "decode_gpus_in_service": decode_gpus,
            "decode_gpus_total": decode_gpus_total}


# ---------------------------------------------------------------- the rule


@pytest.mark.parametrize("frontdoor, inflight, queue, expected", [
    ({"hosts": ["a", "b"], "vip": {"address": "10.0.0.1"}}, 64, None, {"inflight": 64, "queue": 128, "hosts": 1}),
    ({"hosts": ["a", "b"], "vip": None}, 64, None, {"inflight": 32, "queue": 64, "hosts": 2}),
    ({"hosts": ["a", "b", "c"], "vip": None}, 64, 100, {"inflight": 21, "queue": 33, "hosts": 3}),
    ({"hosts": ["a", "b"]}, 1, 0, {"inflight": 1, "queue": 0, "hosts": 2}),   # at least one in flight
    ({"hosts": ["a"]}, "16", "32", {"inflight": 16, "queue": 32, "hosts": 1}),  # templated values arrive as text
])
def test_each_front_door_admits_its_share(frontdoor, inflight, queue, expected):
    assert adm.share(frontdoor, inflight, queue) == expected


def test_the_default_queue_is_the_roles():
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template
    default = yaml.safe_load((ROOT / "roles/frontdoor/defaults/main.yml").read_text())["frontdoor_max_queue"]
    templar = Templar(loader=DataLoader(), variables={"frontdoor_max_inflight": 7})
    assert int(templar.template(trust_as_template(default))) == 7 * adm.DEFAULT_QUEUE_PER_INFLIGHT


@pytest.mark.parametrize("frontdoor, inflight, message", [
    ({"hosts": []}, 64, "no front-door host"),
    ({"hosts": ["a"]}, -1, "the in-flight limit must be a whole number of 0 or more, not -1"),
    ({"hosts": ["a"]}, 2.5, "not 2.5"),
])
def test_share_refuses(frontdoor, inflight, message):
    with pytest.raises(AdmissionError, match=message.replace("(", r"\(")):
        adm.share(frontdoor, inflight)


def test_capacity_counts_prefill_instances_and_decode_gpus():
    assert adm.capacity(B300) == cap(4, 8)
    assert adm.capacity(B300, without=["http://192.0.2.11:8100"]) == cap(3, 8)
    assert adm.capacity(B300, without=["prefill-0", "prefill-1"]) == cap(2, 8)   # names, as a quarantine lists them


def test_a_quarantined_hosts_instances_count_as_planned_and_out():
    """topology.quarantine drops a quarantined host's instances from the plan; they are still capacity the plan
    had (site.yml's role default passes their names as left out: CI's quarantine test failed on that)."""
    gone = ["prefill-0", "prefill-1"]
    plan = dict(B300, instances=[i for i in B300["instances"] if i["name"] not in gone],
                quarantined=[{"host": "b300-prefill-0", "instances": gone}])
    assert adm.capacity(plan, without=gone) == cap(2, 8)
    assert adm.capacity(plan) == cap(2, 8)
    assert adm.capacity(B300, without=["decode-0"]) == cap(4, 0)
    # A temporary decode runs on a prefill instance's GPUs (4 of 8): that instance is no prefill then.
    assert adm.capacity(B300, prefill=["prefill-0"], decode=["prefill-1"]) == cap(1, 4)
    assert adm.capacity(B300, decode=["http://192.0.2.12:8101"]) == cap(3, 4)
    with pytest.raises(AdmissionError, match="instances left out not in the plan: http://192.0.2.99:8100"):
        adm.capacity(B300, without=["http://192.0.2.99:8100"])
    with pytest.raises(AdmissionError, match="decode instances must be a list of instance names or URLs"):
        adm.capacity(B300, decode="http://192.0.2.12:8101")


@pytest.mark.parametrize("capacity, expected", [
    (cap(4, 8), (64, 128, 1.0)),
    (cap(3, 8), (48, 96, 0.75)),
    (cap(2, 8), (32, 64, 0.5)),
    (cap(1, 4), (16, 32, 0.25)),       # a release switch's pair phase
    (cap(3, 4), (32, 64, 0.5)),        # the decode host's maintenance: the temporary decode is the scarcer
    (cap(4, 0), (1, 0, 0.0)),          # no decode: one request, no queue (degraded mode has its own)
    (cap(1, 8, prefill_total=3), (21, 42, 0.3333)),   # rounded down
])
def test_limits_follow_the_scarcer_of_prefill_and_decode(capacity, expected):
    got = adm.limits(FULL, capacity)
    assert (got["inflight"], got["queue"], got["fraction"]) == expected


def test_degraded_admits_the_prefill_share_times_the_factor():
    assert adm.limits(FULL, cap(4, 0), degraded=0.5) == {"inflight": 32, "queue": 64, "fraction": 0.5}
    assert adm.limits(FULL, cap(2, 0), degraded="0.5") == {"inflight": 16, "queue": 32, "fraction": 0.25}
    assert adm.limits({"inflight": 3, "queue": 1}, cap(1, 0), degraded=0.1)["inflight"] == 1


@pytest.mark.parametrize("capacity, degraded, message", [
    (cap(5, 8), None, r"prefill in service \(5\) is more than planned \(4\)"),
    (cap(0, 0, decode_gpus_total=0), None, "the plan has no decode gpus"),
    (cap(4, 8), 0, "the degraded admission factor must be above 0 and at most 1, not 0"),
    (cap(4, 8), 1.5, "not 1.5"),
    ({"prefill_in_service": 1}, None, "prefill_total must be a whole number"),
])
def test_limits_refuse(capacity, degraded, message):
    with pytest.raises(AdmissionError, match=message):
        adm.limits(FULL, capacity, degraded)


# ---------------------------------------------------------------- the plan, step by step


def _admits(steps):
    return [(s["admission_inflight"], s["admission_queue"]) for s in steps]


def test_each_b300_rollout_step_says_what_the_front_door_admits():
    timing = next(iter(inventory.load(B300_INVENTORY, names=("pdctl_rollout_timing",)).values()))
    timing = timing["vars"]["pdctl_rollout_timing"]
    release = rp.release_steps(B300, timing, admission=FULL)
    assert _admits(release) == [(64, 128), (32, 64), (32, 64), (16, 32), (16, 32), (16, 32), (48, 96), (48, 96),
                                (64, 128), (64, 128)]
    assert _admits(rp.prefill_steps(B300, timing, admission=FULL)) == [(64, 128)] + [(48, 96), (48, 96), (64, 128)] * 4
    maintenance = rp.maintenance_steps(B300, timing, admission=FULL)
    assert min(_admits(maintenance)) == (32, 64)
    assert rp.summary(release)["min_admission_inflight"] == 16
    lines = rp.render(release, "T")
    assert lines[4].startswith("  4. [prefill 1/4, decode GPUs 4/8, admits 16 + queue 32] the router restarts")
    assert lines[-1].endswith("; the front door admits at least 16 in flight")
    # Without the limits, the steps and lines are as before.
    assert "admission_inflight" not in rp.release_steps(B300, timing)[0]


def test_pdctl_upgrade_plan_prints_the_admission_of_each_step(capsys):
    assert cli.main(["upgrade", "-i", str(B300_INVENTORY), "--plan", "release"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert "[prefill 1/4, decode GPUs 4/8, admits 16 + queue 32]" in printed[4]
    assert printed[-1].endswith("the front door admits at least 16 in flight")
    # The lab: two front doors behind a virtual address, each admits the lab's whole 16.
    assert cli.main(["upgrade", "-i", str(ROOT / "inventories/lab"), "--plan", "release"]) == 0
    assert "admits 16 + queue 32]" in capsys.readouterr().out.splitlines()[1]


# ---------------------------------------------------------------- the playbooks' traffic moves


def _moves(tasks, inherited=None, found=None):
    """Every move of the front door (pdctl.vllm_pd.traffic's frontdoor_away / frontdoor_home): (entry point, task
    name, vars with the enclosing blocks')."""
    found = [] if found is None else found
    for task in tasks or []:
        scope = dict(inherited or {}, **(task.get("vars") or {}))
        for key in ("block", "rescue", "always"):
            _moves(task.get(key), scope, found)
        role = task.get("ansible.builtin.include_role") or {}
        target = role.get("tasks_from", "").removesuffix(".yml") if role.get("name") == "pdctl.vllm_pd.traffic" else ""
        # Inside the traffic role (temporary_decode_in / _out), a move is one of its own tasks files.
        target = target or str(task.get("ansible.builtin.include_tasks") or "").removesuffix(".yml")
        # standby_in / standby_out: the routers' membership, then frontdoor_away / frontdoor_home.
        target = {"standby_in": "frontdoor_away", "standby_out": "frontdoor_home"}.get(target, target)
        if target in ("frontdoor_away", "frontdoor_home"):
            found.append((target, task["name"], scope))
    return found


def _template(expr, variables):
    """expr templated as Ansible does a task's variable: the playbook's own variables are templates too."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template
    trusted = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in variables.items()}
    return Templar(loader=DataLoader(), variables=trusted).template(trust_as_template(expr))


def _instances(*names):
    return [i for i in B300["instances"] if i["name"] in names]


# What each traffic move's target serves on B300 (prefill instances, decode GPUs), with: the batch rolled,
# prefill-0 and prefill-1 (pdctl_rollout_prefill_keep 0.5); the release switch's staging instances, prefill-0 and prefill-1; the lender of the temporary decode
# (maintenance of the decode host, a decode change), prefill-3;
# a prefill host's turn, b300-prefill-0's instances; in a failed turn's rescue, the temporary decode running.
EXPECTED = {
    ("upgrade/batch.yml", "Front door to the standby routers; the routers drain"): (2, 8),
    ("upgrade/batch.yml", "Front door back to the routers, standby out"): (4, 8),
    ("upgrade/release.yml", "Front door to the standby routers; the routers drain"): [(2, 8), (3, 8)],
    ("upgrade/release.yml", "Front door to the new release (the routers); the old pool behind the standbys drains"): (1, 4),
    ("upgrade/release.yml", "Front door back to the routers, standby out"): (4, 8),
    ("maintenance/out.yml", "Out of service - standby routers without this host's instances; the front door to them"):
        (2, 8),
    ("maintenance/back.yml",
     "Behind the standby on the plan's membership, before the routers take this host back (it was out already)"): (4, 8),
    ("traffic/temporary_decode_in.yml", "Standby routers without the lender, the front door to them: {{ traffic_lender.name }}"):
        (3, 8),
    ("traffic/temporary_decode_in.yml", "Front door to the routers (the temporary decode serves); the standbys drain"): (3, 4),
    ("traffic/temporary_decode_out.yml",
     "Standby routers with the decode back, without the lender; the routers (and the temporary decode) drain"): (3, 8),
    ("upgrade/decode.yml", "The routers on the plan's membership; front door back to them, standby out"): (4, 8),
    ("maintenance/back.yml", "The routers on the plan's membership; front door back to them, standby out"): (4, 8),
    ("maintenance/rescue.yml", "Standby routers with what still serves; the front door to them"): (1, 4),
    ("maintenance/rescue.yml", "The routers with what still serves; the front door back to them"): (1, 4),
    ("upgrade_pass.yml", "Front door back to the routers (a run that was interrupted may have left a standby in rotation)"):
        (4, 8),
    ("maintenance.yml", "Front door back to the routers, standby out"): (4, 8),
}


def test_every_traffic_move_hands_the_front_doors_what_its_target_serves():
    context = {"preflight_plan": B300, "upgrade_batch": _instances("prefill-0", "prefill-1"),
               "upgrade_decision": {"staging": _instances("prefill-0", "prefill-1")},
               "traffic_lender": _instances("prefill-3")[0],
               "maintenance_turn": {"urls": [i["url"] for i in _instances("prefill-0", "prefill-1")],
                                    "instances": _instances("prefill-0", "prefill-1"), "decode_turn": True,
                                    "lender": _instances("prefill-3")[0]},
               "maintenance_running": {"results": [{"stdout": "active", "item": {"name": "decode-temporary"}}]}}
    seen = {}
    # Every playbook and task file: a traffic move added anywhere must say what its target serves here too.
    # The steps of the rolling playbooks' roles (upgrade, maintenance) and the traffic role's own entry points
    # that move the front door (temporary_decode_in / _out) too; a role's file is named "<role>/<file>".
    for path in (sorted((ROOT / "playbooks").glob("*.yml")) + sorted((ROOT / "playbooks/tasks").glob("*.yml"))
                 + sorted((ROOT / "roles/upgrade/tasks").glob("*.yml"))
                 + sorted((ROOT / "roles/maintenance/tasks").glob("*.yml"))
                 + sorted((ROOT / "roles/traffic/tasks").glob("temporary_decode_*.yml"))):
        doc = yaml.safe_load(path.read_text()) or []
        tasks = [t for play in doc for key in ("pre_tasks", "tasks", "post_tasks") for t in play.get(key) or []] \
            if path.parent.name == "playbooks" else doc
        name = "%s/%s" % (path.parent.parent.name, path.name) if "roles" in path.parts else path.name
        for target, task, scope in _moves(tasks):
            variables = dict(context, **scope)
            if target == "frontdoor_away" or "traffic_check_decode" in scope:
                # The move's target serves less than the plan: the call site must say how much.
                assert "traffic_capacity" in scope, "%s: %r gives no traffic_capacity" % (name, task)
            if "traffic_capacity" in scope:
                got = _template(scope["traffic_capacity"], variables)
            else:   # frontdoor_home's default: the plan's whole capacity
                got = adm.capacity(B300)
            seen.setdefault((name, task), []).append((got["prefill_in_service"], got["decode_gpus_in_service"]))
    assert {k: v[0] if len(v) == 1 else v for k, v in seen.items()} == EXPECTED
