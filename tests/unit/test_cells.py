"""Cells in the planner (issue 53, docs/cells.md): a cell's routers pair only its own instances, KV and the
firewall stay inside it, every cell is checked on its own, and inventories/b300-fleet plans 20 cells.

The fleet's numbers are written out from its hosts.yml (cell NN: NN-prefill-0/1 at 192.0.2.(10 NN + 1, 2),
NN-decode-0 at 10 NN + 3), not derived from the code under test."""
from __future__ import annotations

import copy

import pytest

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import admission, firewall, topology
from inventories import B300, ROOT
from pdctl import cli, inventory

FLEET = ROOT / "inventories" / "b300-fleet"
FRONTDOORS = ["fleet-frontdoor-0", "fleet-frontdoor-1"]
MONITORING = "cell01-decode-0"  # the first router host of the fleet's router group (roles/monitoring)


def address(cell, host):
    return "192.0.2.%d" % (10 * cell + {"prefill-0": 1, "prefill-1": 2, "decode-0": 3}[host])


@pytest.fixture(scope="module")
def fleet_hosts():
    return inventory.load(FLEET)


@pytest.fixture(scope="module")
def fleet_plan(fleet_hosts):
    return topology.build_plan(copy.deepcopy(fleet_hosts))


def two_cells(fleet_hosts):
    """cell01 and cell02 of the fleet with its front doors (a copy to change)."""
    keep = [h for h in fleet_hosts if h.startswith(("cell01-", "cell02-"))] + FRONTDOORS
    return {h: copy.deepcopy(fleet_hosts[h]) for h in keep}


def problems_of(hosts):
    with pytest.raises(topology.PlanError) as err:
        topology.build_plan(hosts)
    return err.value.problems


# ---------------------------------------------------------------- pairing inside a cell

def test_two_cells_pair_only_inside(fleet_hosts):
    plan = topology.build_plan(two_cells(fleet_hosts))
    assert [c["name"] for c in plan["cells"]] == ["cell01", "cell02"]
    for cell in (1, 2):
        name = "cell%02d" % cell
        prefill = ["http://%s:%d" % (address(cell, h), port) for h in ("prefill-0", "prefill-1") for port in (8100, 8101)]
        decode = ["http://%s:8100" % address(cell, "decode-0")]
        routers = [r for r in plan["routers"] if r["cell"] == name]
        assert [r["host"] for r in routers] == ["%s-decode-0" % name, "%s-prefill-0" % name]
        for router in routers:
            assert router["prefill_urls"] == prefill and router["decode_urls"] == decode
        assert {i["cell"] for i in plan["instances"] if i["host"].startswith(name)} == {name}
    # KV-path checks pair a prefill GPU with its own cell's decode only.
    paths = topology.kv_check_paths(plan, 5690)
    assert paths and all(p["prefill_host"][:6] == p["decode_host"][:6] for p in paths)


def test_cells_list_hosts_routers_instances_and_capacity(fleet_hosts):
    plan = topology.build_plan(two_cells(fleet_hosts))
    first = plan["cells"][0]
    assert first == {"name": "cell01", "hosts": ["cell01-decode-0", "cell01-prefill-0", "cell01-prefill-1"],
                     "routers": ["cell01-decode-0", "cell01-prefill-0"],
                     "prefill": ["prefill-0", "prefill-1", "prefill-2", "prefill-3"], "decode": ["decode-0"],
                     "prefill_instances": 4, "decode_gpus": 8}
    # The same numbers admission counts (one formula): a cell's capacity is its view's.
    view = admission.capacity(topology.cell_view(plan, "cell01"))
    assert (view["prefill_total"], view["decode_gpus_total"]) == (4, 8)


def test_one_cell_is_the_default_and_its_view_is_the_plan():
    plan = inventory.plan(B300)
    assert [c["name"] for c in plan["cells"]] == [topology.DEFAULT_CELL]
    assert {i["cell"] for i in plan["instances"]} == {r["cell"] for r in plan["routers"]} == {topology.DEFAULT_CELL}
    view = topology.cell_view(plan, topology.DEFAULT_CELL)
    assert view["instances"] == plan["instances"] and view["routers"] == plan["routers"]
    assert view == plan


def test_a_cell_view_is_that_cell_with_the_fleets_front_door(fleet_plan):
    view = topology.cell_view(fleet_plan, "cell03")
    assert {i["host"] for i in view["instances"]} == {"cell03-prefill-0", "cell03-prefill-1", "cell03-decode-0"}
    assert [r["host"] for r in view["routers"]] == ["cell03-decode-0", "cell03-prefill-0"]
    assert view["router"] == view["routers"][0]
    assert view["frontdoor"] == fleet_plan["frontdoor"] and view["frontdoor"]["hosts"] == FRONTDOORS
    assert view["hosts"] == ["cell03-decode-0", "cell03-prefill-0", "cell03-prefill-1"] + FRONTDOORS
    with pytest.raises(ValueError, match="no cell 'cell21' in the plan"):
        topology.cell_view(fleet_plan, "cell21")


def test_another_cells_quarantine_is_no_part_of_a_cells_capacity(fleet_plan):
    plan = dict(fleet_plan, min_prefill_instances=60)
    out = topology.quarantine(plan, [{"host": "cell04-prefill-1", "task": "GPUs", "msg": "one is missing"}],
                              {"prefill": [h for h in fleet_plan["hosts"] if "-prefill-" in h]})
    cell04 = admission.capacity(topology.cell_view(out, "cell04"))
    cell05 = admission.capacity(topology.cell_view(out, "cell05"))
    assert (cell04["prefill_in_service"], cell04["prefill_total"]) == (2, 4)
    assert (cell05["prefill_in_service"], cell05["prefill_total"]) == (4, 4)
    # Its own routers lose its instances, no other cell's router changes.
    for router in out["routers"]:
        assert len(router["prefill_urls"]) == (2 if router["cell"] == "cell04" else 4)


def test_a_quarantine_may_not_empty_a_cell(fleet_plan):
    plan = dict(fleet_plan, min_prefill_instances=60)
    failures = [{"host": h, "task": "GPUs", "msg": "one is missing"} for h in ("cell07-prefill-0", "cell07-prefill-1")]
    with pytest.raises(topology.QuarantineError, match="cell cell07 would keep no prefill instance"):
        topology.quarantine(plan, failures, {"prefill": [h for h in fleet_plan["hosts"] if "-prefill-" in h]})


# ---------------------------------------------------------------- what the planner refuses, naming the cell

def _drop(hosts, *names):
    for name in names:
        del hosts[name]
    return hosts


def _spare_router(hosts, cell=None):
    hosts["spare-0"] = copy.deepcopy(hosts["fleet-frontdoor-0"])
    hosts["spare-0"]["groups"] = ["router"] + ([cell] if cell else [])
    hosts["spare-0"]["vars"]["ansible_host"] = "192.0.2.250"
    hosts["spare-0"]["vars"].pop("pdctl_cell", None)
    if cell:
        hosts["spare-0"]["vars"]["pdctl_cell"] = cell
    return hosts


def _prefill_tp2(hosts):
    for name in ("cell02-prefill-0", "cell02-prefill-1"):
        pools = hosts[name]["vars"]["pdctl_pools"]
        pools["prefill"] = {"tensor_parallel_size": 2, "data_parallel_size": 2}
    return hosts


def _router_group_without(hosts, cell):
    for name, host in hosts.items():
        if name.startswith(cell):
            host["groups"] = [g for g in host["groups"] if g != "router"]
    return hosts


def _in_two_cells(hosts):
    hosts["cell01-prefill-1"]["groups"].append("cell02")
    return hosts


def _cell_name(hosts, value):
    for name in ("cell02-prefill-0", "cell02-prefill-1", "cell02-decode-0"):
        hosts[name]["vars"]["pdctl_cell"] = value
        hosts[name]["groups"] = [g for g in hosts[name]["groups"] if g != "cell02"]
    return hosts


CELL_CASES = [
    ("no decode", lambda h: _drop(h, "cell02-decode-0"), "cell cell02: no decode instance"),
    ("no prefill", lambda h: _drop(h, "cell02-prefill-0", "cell02-prefill-1"), "cell cell02: no prefill instance"),
    ("no router", lambda h: _router_group_without(h, "cell02"), "cell cell02: no router host"),
    ("router outside a serving cell", lambda h: _spare_router(h, "cell03"),
     "cell cell03: router host spare-0 but no serving instance"),
    ("router without a cell among cells", lambda h: _spare_router(h),
     "cell default: router host spare-0 but no serving instance"),
    ("prefill TP above decode TP", _prefill_tp2, "cell cell02: cell02-prefill-0 prefill-4: prefill TP2 is larger than "
     "decode cell02-decode-0 decode-1 TP1"),
    ("host in another cell's group", _in_two_cells,
     "cell01-prefill-1 is in the group of cell cell02 but its pdctl_cell is cell01"),
    ("name not an identifier", lambda h: _cell_name(h, "cell-2"),
     "pdctl_cell 'cell-2' on cell02-decode-0, cell02-prefill-0, cell02-prefill-1 is not a simple identifier"),
    ("name not a string", lambda h: _cell_name(h, 2), "pdctl_cell 2 on cell02-decode-0"),
]


@pytest.mark.parametrize("case,change,expected", CELL_CASES, ids=[c[0] for c in CELL_CASES])
def test_each_cell_problem_names_its_cell(fleet_hosts, case, change, expected):
    problems = problems_of(change(two_cells(fleet_hosts)))
    assert any(expected in p for p in problems), problems
    # The other cell is fine: nothing is reported about it.
    assert not any("cell cell01" in p for p in problems), problems


def test_a_cells_group_is_known_and_problems_come_all_at_once(fleet_hosts):
    hosts = _router_group_without(_drop(two_cells(fleet_hosts), "cell01-decode-0"), "cell02")
    problems = problems_of(hosts)
    assert not any("does not know" in p for p in problems), problems
    assert any(p.startswith("cell cell01: no decode instance") for p in problems)
    assert any(p.startswith("cell cell02: no router host") for p in problems)


def test_the_cli_exits_2_on_a_cell_problem(tmp_path, capsys):
    import shutil
    inv = tmp_path / "fleet"
    shutil.copytree(FLEET, inv)
    (inv / "group_vars" / "cell05" / "cell.yml").write_text("---\npdctl_cell: cell-5\n")
    assert cli.main(["plan", "-i", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "pdctl_cell 'cell-5' on cell05-decode-0, cell05-prefill-0, cell05-prefill-1 is not a simple identifier" in err


# ---------------------------------------------------------------- the fleet example

def test_the_fleet_plans_20_cells_of_the_recipe(fleet_plan):
    assert [c["name"] for c in fleet_plan["cells"]] == ["cell%02d" % n for n in range(1, 21)]
    pools = [i["pool"] for i in fleet_plan["instances"]]
    assert pools.count("prefill") == 80 and pools.count("decode") == 20
    assert len(fleet_plan["routers"]) == 40
    for router in fleet_plan["routers"]:
        cell = int(router["cell"][4:])
        assert router["host"].startswith(router["cell"] + "-")
        assert len(router["prefill_urls"]) == 4 and len(router["decode_urls"]) == 1
        hosts = {u.split("//")[1].split(":")[0] for u in router["prefill_urls"] + router["decode_urls"]}
        assert hosts == {address(cell, h) for h in ("prefill-0", "prefill-1", "decode-0")}
    assert all(c["prefill_instances"] == 4 and c["decode_gpus"] == 8 for c in fleet_plan["cells"])
    assert fleet_plan["frontdoor"]["hosts"] == FRONTDOORS and fleet_plan["frontdoor"]["vip"]["address"] == "192.0.2.10"


def test_pdctl_plan_prints_the_cells(capsys):
    assert cli.main(["plan", "-i", str(FLEET)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["CELL", "INSTANCE", "HOST"]
    assert ("  cell20: routers cell20-decode-0, cell20-prefill-0; 4 prefill instances (prefill-76, prefill-77, "
            "prefill-78, prefill-79), 8 decode GPUs (decode-19); hosts cell20-decode-0, cell20-prefill-0, "
            "cell20-prefill-1") in out
    assert "router: http://192.0.2.53:8000 on cell05-decode-0 in cell05 (metrics :29000)" in out


def fleet_rules(plan, host):
    addresses = {h: [a] for h, a in _fleet_addresses().items()}
    inputs = {"addresses": addresses, "admin_networks": ["203.0.113.0/24"], "client_networks": ["198.51.100.0/24"],
              "ssh_port": 22, "monitoring_host": MONITORING, "prometheus_port": 9090, "node_exporter_port": 9100,
              "dcgm_exporter_port": 9400, "ucx_environment": {}, "kv_check_port": 5690, "kv_check_gpus": "per_numa",
              "model_fanout_port": 8790}
    return firewall.rules(plan, inputs, only=[host])[host]


def _fleet_addresses():
    out = {h: "192.0.2.%d" % (2 + FRONTDOORS.index(h)) for h in FRONTDOORS}
    for cell in range(1, 21):
        for kind in ("prefill-0", "prefill-1", "decode-0"):
            out["cell%02d-%s" % (cell, kind)] = address(cell, kind)
    return out


def test_the_fleets_firewall_is_cell_local(fleet_plan):
    rules = fleet_rules(fleet_plan, "cell05-prefill-1")
    own_decode, own_router, own_peer = address(5, "decode-0"), address(5, "prefill-0"), address(5, "prefill-0")
    other_decode, other_router = address(6, "decode-0"), address(6, "prefill-0")
    # API (8100): its cell's routers and Prometheus' host (a router host of cell01), no other cell's router.
    assert firewall.allowed(rules, 8100, own_decode) == ["prefill-18 api"]
    assert firewall.allowed(rules, 8100, own_router) == ["prefill-18 api"]
    assert firewall.allowed(rules, 8100, address(1, "decode-0")) == ["prefill-18 api"]
    assert firewall.allowed(rules, 8100, other_router) == [] and firewall.allowed(rules, 8100, other_decode) == []
    # NIXL side channel (5600-5603) and UCX over TCP: its cell's decode and other prefill host only.
    assert firewall.allowed(rules, 5600, own_decode) == ["prefill-18 nixl side channel"]
    assert firewall.allowed(rules, 5600, own_peer) == ["prefill-18 nixl side channel"]
    assert firewall.allowed(rules, 5600, other_decode) == [] and firewall.allowed(rules, 40000, other_decode) == []
    assert firewall.allowed(rules, 40000, own_decode) == ["kv tcp"]
    # KV-path check listeners: its cell's decode host only.
    assert firewall.allowed(rules, 5690, own_decode) == ["kv path check"]
    assert firewall.allowed(rules, 5690, other_decode) == []
    # The decode host: its cell's prefill hosts move KV with it, another cell's do not.
    decode_rules = fleet_rules(fleet_plan, "cell05-decode-0")
    assert firewall.allowed(decode_rules, 5600, address(5, "prefill-1")) == ["decode-4 nixl side channel"]
    assert firewall.allowed(decode_rules, 5600, address(6, "prefill-1")) == []
    # The front doors (fleet-wide) check every cell's decode /health themselves.
    assert firewall.allowed(decode_rules, 8100, "192.0.2.2") == ["decode-4 api"]


@pytest.mark.parametrize("command", [["upgrade", "--check", "--plan", "prefill"], ["upgrade", "--check", "--plan", "release"],
                                     ["maintain", "--check", "--plan"]])
def test_a_rollout_plan_of_several_cells_is_refused_not_printed_wrong(command, capsys):
    """Rollouts by cell are not built: the playbooks refuse several cells (preflight 0021-cells.yml), so --plan
    refuses too (exit 2, naming the cells) instead of printing the fleet as one cell's rollout."""
    assert cli.main([command[0], "-i", str(FLEET)] + command[1:]) == 2
    err = capsys.readouterr().err
    assert "plans 20 cells (cell01, cell02" in err and "rollouts by cell are not built yet" in err


def test_the_preflight_refuses_several_cells_before_anything_changes():
    import yaml
    tasks = yaml.safe_load((ROOT / "roles/preflight/tasks/0021-cells.yml").read_text())
    assert [t["ansible.builtin.assert"]["that"] for t in tasks] == ["preflight_plan.cells | length <= 1"]
    main = yaml.safe_load((ROOT / "roles/preflight/tasks/main.yml").read_text())
    order = [t.get("ansible.builtin.import_tasks") for t in main]
    # Right after the plan, before the host checks (every playbook's first play; render includes 0020 alone).
    assert order.index("0021-cells.yml") == order.index("0020-plan.yml") + 1
