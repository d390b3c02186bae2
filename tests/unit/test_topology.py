"""The planner on the real inventories and on malformed ones (through `pdctl plan`)."""
import json
import re
import subprocess
import sys

import pytest

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import topology
from inventories import B300, ROOT, inventory_variant
from malformed import CASES
from pdctl import cli, inventory


def plan_cli(capsys, inventory, *extra):
    rc = cli.main(["plan", "-i", str(inventory), *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_b300_plan_matches_the_recipe(capsys):
    rc, out, _ = plan_cli(capsys, B300, "--json")
    assert rc == 0
    plan = json.loads(out)
    prefill = [i for i in plan["instances"] if i["pool"] == "prefill"]
    decode = [i for i in plan["instances"] if i["pool"] == "decode"]
    assert len(prefill) == 4 and len(decode) == 1
    for host in ("b300-prefill-0", "b300-prefill-1"):
        mine = [i for i in prefill if i["host"] == host]
        assert [i["gpus"] for i in mine] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert all(i["tensor_parallel_size"] == 1 and i["data_parallel_size"] == 4 for i in mine)
        assert len({i["api_port"] for i in mine}) == 2
        (a_lo, a_hi), (b_lo, b_hi) = (i["side_channel_ports"] for i in mine)
        assert a_hi < b_lo or b_hi < a_lo, "side-channel ranges must be disjoint"
        assert len({i["dp_rpc_port"] for i in mine}) == 2
    assert decode[0]["host"] == "b300-decode-0"
    assert decode[0]["gpus"] == list(range(8)) and decode[0]["data_parallel_size"] == 8
    assert decode[0]["side_channel_ports"][1] - decode[0]["side_channel_ports"][0] == 7
    assert plan["router"]["prefill_urls"] == [i["url"] for i in prefill]
    assert plan["router"]["decode_urls"] == [decode[0]["url"]]
    # NIXL side channel is advertised on the host's routable address, never localhost.
    assert all(i["side_channel_host"] not in ("localhost", "127.0.0.1") for i in plan["instances"])


def test_table_output_lists_every_instance(capsys):
    rc, out, _ = plan_cli(capsys, B300)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["INSTANCE", "HOST", "POOL", "GPUS", "TPxDP", "API", "NIXL", "SIDE", "CHANNEL",
                                "DP", "RPC", "NUMA", "KV", "NICS"]
    rows = [line.split() for line in lines[1:lines.index("")]]
    assert rows == [
        ["decode-0", "b300-decode-0", "decode", "0,1,2,3,4,5,6,7", "1x8", "8100", "192.0.2.13:5600-5607", "13345", "0,1",
         "mlx5_0,mlx5_1,mlx5_6,mlx5_7,mlx5_8,mlx5_9,mlx5_10,mlx5_11"],
        ["prefill-0", "b300-prefill-0", "prefill", "0,1,2,3", "1x4", "8100", "192.0.2.11:5600-5603", "13345", "0", "mlx5_0,mlx5_1,mlx5_6,mlx5_7"],
        ["prefill-1", "b300-prefill-0", "prefill", "4,5,6,7", "1x4", "8101", "192.0.2.11:5604-5607", "13346", "1", "mlx5_8,mlx5_9,mlx5_10,mlx5_11"],
        ["prefill-2", "b300-prefill-1", "prefill", "0,1,2,3", "1x4", "8100", "192.0.2.12:5600-5603", "13345", "0", "mlx5_0,mlx5_1,mlx5_6,mlx5_7"],
        ["prefill-3", "b300-prefill-1", "prefill", "4,5,6,7", "1x4", "8101", "192.0.2.12:5604-5607", "13346", "1", "mlx5_8,mlx5_9,mlx5_10,mlx5_11"],
    ]
    assert "router: http://192.0.2.13:8000 on b300-decode-0" in out
    assert "router: http://192.0.2.11:8000 on b300-prefill-0" in out
    assert "front door: https://192.0.2.10:443 on b300-decode-0, b300-prefill-0 (metrics :8405)" in out
    assert "virtual address 192.0.2.10 (VRRP id 39) moves between the front-door hosts" in out


def test_lab_differs_from_b300_only_in_addresses(capsys):
    def shape(inv):
        plan = json.loads(plan_cli(capsys, inv, "--json")[1])
        return [(i["name"], i["pool"], i["gpus"], i["api_port"], i["side_channel_ports"], i["dp_rpc_port"],
                 i["model_path"], i["vllm_version"]) for i in plan["instances"]]
    assert shape(ROOT / "inventories/lab") == shape(B300)


@pytest.mark.parametrize("case,overrides,expected", CASES, ids=[c[0] for c in CASES])
def test_malformed_inventory_is_rejected(tmp_path, capsys, case, overrides, expected):
    inv = inventory_variant(tmp_path / "inv", overrides)
    rc, out, err = plan_cli(capsys, inv)
    assert rc == 2, out
    assert "is invalid" in err
    for words in expected:
        assert words in err, "expected %r in:\n%s" % (words, err)


def test_each_malformed_case_is_a_different_diagnosis(tmp_path, capsys):
    """No two cases end in the same set of problems, so each exercises a check of its own."""
    seen = {}
    for name, overrides, _ in CASES:
        rc, _, err = plan_cli(capsys, inventory_variant(tmp_path / name, overrides))
        problems = frozenset(line.strip() for line in err.splitlines() if line.startswith("  - "))
        assert rc == 2 and problems, name
        assert problems not in seen, "%s and %s report the same problems: %s" % (seen.get(problems), name, problems)
        seen[problems] = name
    assert len(seen) >= 12


def test_exit_code_from_the_console_script(tmp_path):
    inv = inventory_variant(tmp_path / "inv", CASES[0][1])
    res = subprocess.run([sys.executable, "-m", "pdctl.cli", "plan", "-i", str(inv)], capture_output=True, text=True)
    assert res.returncode == 2
    assert "GPU 2 is in both" in res.stderr


def test_missing_inventory_is_exit_2(capsys, tmp_path):
    rc, _, err = plan_cli(capsys, tmp_path / "nope")
    assert rc == 2 and "does not exist" in err


def test_explicit_placement_is_honoured():
    common = {
        "pdctl_gpu_count": 8, "pdctl_model_path": "/m", "pdctl_versions": {"vllm": "1"},
        "pdctl_pools": {"prefill": {"tensor_parallel_size": 1, "data_parallel_size": 2},
                        "decode": {"tensor_parallel_size": 2, "data_parallel_size": 2}},
        "pdctl_ports": {"api_base": 9000, "side_channel_base": 6000, "dp_rpc_base": 14000,
                        "router": 8000, "router_metrics": 8001, "frontdoor": 8443, "frontdoor_metrics": 8405}}
    hosts = {
        "hp": {"groups": ["serving", "prefill"],
               "vars": dict(common, pdctl_instances=[{"pool": "prefill", "gpus": "6,7", "name": "p"}])},
        "hd": {"groups": ["serving", "decode", "router"],
               "vars": dict(common, pdctl_instances=[{"pool": "decode", "gpus": "2-5", "side_channel_port": 6010}])},
    }
    plan = topology.build_plan(hosts)
    d, p = sorted(plan["instances"], key=lambda i: i["pool"])
    assert p["name"] == "p" and p["cuda_visible_devices"] == "6,7" and p["side_channel_ports"] == [6000, 6001]
    assert d["gpus"] == [2, 3, 4, 5] and d["side_channel_ports"] == [6010, 6011]
    # The front door defaults to the router's host, so the router listens on loopback only.
    assert plan["router"]["bind"] == "127.0.0.1" and plan["router"]["url"] == "http://127.0.0.1:8000"
    assert plan["frontdoor"]["url"] == "https://hd:8443"


def test_site_groups_are_accepted_when_declared():
    """pdctl_extra_groups lets an operator keep site groupings without the planner refusing them."""
    inv = ROOT / "inventories/lab"
    hosts = inventory.load(inv)
    hosts["lab-prefill-0"]["groups"].append("rack_a")
    with pytest.raises(topology.PlanError, match="lab-prefill-0 is in group rack_a"):
        topology.build_plan(hosts)
    hosts["lab-prefill-0"]["vars"]["pdctl_extra_groups"] = ["rack_a"]
    assert len(topology.build_plan(hosts)["instances"]) == 5


def test_every_problem_is_reported_at_once():
    hosts = {"h": {"groups": ["prefill"], "vars": {"pdctl_instances": [{"pool": "nope"}]}}}
    with pytest.raises(topology.PlanError) as err:
        topology.build_plan(hosts)
    text = str(err.value)
    assert "pdctl_ports.api_base is not set" in text and "router group" in text


def _lab_hosts(**groups):
    """The lab inventory as the planner reads it with one router (lab-decode-0), without its frontdoor group
    (the planner's default) and without the front door's virtual address, with hosts added to groups
    ({group: [host, ...]})."""
    hosts = inventory.load(ROOT / "inventories/lab")
    for name, host in hosts.items():
        host["groups"] = [g for g in host["groups"] if g != "frontdoor" and (g != "router" or name == "lab-decode-0")]
        host["vars"].pop("pdctl_frontdoor_vip", None)
    for group, members in groups.items():
        for host in members:
            hosts[host]["groups"].append(group)
    return hosts


def test_frontdoor_defaults_to_the_router_host():
    plan = topology.build_plan(_lab_hosts())
    assert plan["frontdoor"] == {"hosts": ["lab-decode-0"], "addresses": ["10.89.64.13"], "port": 8443,
                                 "metrics_port": 8405, "url": "https://10.89.64.13:8443", "vip": None}
    assert plan["routers"] == [plan["router"]]
    router = plan["router"]
    assert router["host"] == "lab-decode-0" and router["address"] == "10.89.64.13"
    assert router["bind"] == "127.0.0.1" and router["url"] == "http://127.0.0.1:8000"
    assert router["prefill_urls"] == [i["url"] for i in plan["instances"] if i["pool"] == "prefill"]


def test_two_routers_are_accepted_and_listen_on_their_addresses():
    plan = topology.build_plan(_with_vip(_lab_hosts(router=["lab-prefill-0"])))
    assert [r["host"] for r in plan["routers"]] == ["lab-decode-0", "lab-prefill-0"]
    assert plan["router"] == plan["routers"][0]
    # Each front-door host must reach every router, so no router listens on loopback.
    assert [(r["bind"], r["url"]) for r in plan["routers"]] == [
        ("10.89.64.13", "http://10.89.64.13:8000"), ("10.89.64.11", "http://10.89.64.11:8000")]
    assert plan["routers"][0]["decode_urls"] == plan["routers"][1]["decode_urls"]
    assert plan["frontdoor"]["hosts"] == ["lab-decode-0", "lab-prefill-0"]
    assert plan["frontdoor"]["addresses"] == ["10.89.64.13", "10.89.64.11"]
    assert plan["frontdoor"]["url"] == "https://10.89.64.200:8443"


def test_with_the_front_door_on_one_of_two_routers_that_router_alone_listens_on_loopback():
    plan = topology.build_plan(_lab_hosts(router=["lab-prefill-0"], frontdoor=["lab-decode-0"]))
    assert plan["frontdoor"]["hosts"] == ["lab-decode-0"]
    assert [(r["host"], r["url"]) for r in plan["routers"]] == [
        ("lab-decode-0", "http://127.0.0.1:8000"), ("lab-prefill-0", "http://10.89.64.11:8000")]


def test_frontdoor_group_on_a_host_of_its_own():
    hosts = _lab_hosts()
    hosts["lab-gw-0"] = {"groups": ["frontdoor"], "vars": dict(hosts["lab-decode-0"]["vars"], ansible_host="10.89.64.20",
                                                              pdctl_instances=[])}
    plan = topology.build_plan(hosts)
    assert plan["frontdoor"]["hosts"] == ["lab-gw-0"] and plan["frontdoor"]["url"] == "https://10.89.64.20:8443"
    assert plan["router"]["bind"] == "10.89.64.13"
    assert "lab-gw-0" in plan["hosts"]


def test_frontdoor_port_clash_with_an_instance_port():
    hosts = _lab_hosts()
    hosts["lab-decode-0"]["vars"]["pdctl_ports"] = dict(hosts["lab-decode-0"]["vars"]["pdctl_ports"], frontdoor=8100)
    with pytest.raises(topology.PlanError, match="decode-0 API port 8100 overlaps front door port 8100"):
        topology.build_plan(hosts)
    # The same port on a host without the front door is no clash.
    hosts = _lab_hosts()
    hosts["lab-prefill-0"]["vars"]["pdctl_ports"] = dict(hosts["lab-prefill-0"]["vars"]["pdctl_ports"], frontdoor=8100)
    assert topology.build_plan(hosts)["frontdoor"]["port"] == 8443


def _set_ports(hosts, host, **ports):
    hosts[host]["vars"]["pdctl_ports"] = dict(hosts[host]["vars"]["pdctl_ports"], **ports)


def test_model_fanout_port_clash_with_an_instance_port():
    hosts = _lab_hosts()
    _set_ports(hosts, "lab-prefill-0", model_fanout=8101)
    with pytest.raises(topology.PlanError, match="lab-prefill-0: port clash: prefill-1 API port 8101 overlaps "
                                                 "model_fanout port 8101"):
        topology.build_plan(hosts)


@pytest.mark.parametrize("host,change,expected", [
    # node exporter on every serving and router host
    ("lab-decode-0", {"node_exporter_port": 8100},
     r"lab-decode-0: port clash: decode-0 API port 8100 overlaps node exporter port "
     r"\(pdctl_monitoring.node_exporter_port\) 8100"),
    # the DCGM exporter on the serving hosts
    ("lab-prefill-1", {"dcgm_exporter": {"enabled": True, "port": 13346}},
     r"lab-prefill-1: port clash: prefill-3 DP RPC port 13346 overlaps DCGM exporter port "
     r"\(pdctl_monitoring.dcgm_exporter.port\) 13346"),
    # Prometheus on the router host
    ("lab-decode-0", {"port": 5603},
     r"lab-decode-0: port clash: decode-0 NIXL side-channel range 5600-5607 overlaps Prometheus port "
     r"\(pdctl_monitoring.port\) 5603"),
])
def test_monitoring_port_clash_with_an_instance_port(host, change, expected):
    hosts = _lab_hosts()
    hosts[host]["vars"]["pdctl_monitoring"] = dict(hosts[host]["vars"]["pdctl_monitoring"], **change)
    with pytest.raises(topology.PlanError, match=expected):
        topology.build_plan(hosts)


def test_monitoring_ports_count_only_where_they_listen():
    hosts = _lab_hosts()
    # Prometheus runs on a router host: an API port of the same number on a prefill host is no clash,
    # nor is a disabled DCGM exporter's port.
    for host in ("lab-prefill-0", "lab-prefill-1"):
        hosts[host]["vars"]["pdctl_monitoring"] = dict(hosts[host]["vars"]["pdctl_monitoring"], port=8100,
                                                       dcgm_exporter={"enabled": False, "port": 8101})
    assert topology.build_plan(hosts)["instances"]


def test_monitoring_and_fanout_ports_clash_with_each_other():
    hosts = _lab_hosts()
    _set_ports(hosts, "lab-decode-0", model_fanout=9100)
    with pytest.raises(topology.PlanError, match=r"lab-decode-0: port clash: model_fanout port 9100 overlaps "
                                                 r"node exporter port \(pdctl_monitoring.node_exporter_port\) 9100"):
        topology.build_plan(hosts)


def _with_vip(hosts, vip=None):
    for host in hosts.values():
        host["vars"]["pdctl_frontdoor_vip"] = vip or {"address": "10.89.64.200", "virtual_router_id": 39}
    return hosts


def test_the_lab_runs_two_front_doors_behind_one_virtual_address():
    plan = topology.build_plan(inventory.load(ROOT / "inventories/lab"))
    fd = plan["frontdoor"]
    assert fd["hosts"] == ["lab-decode-0", "lab-prefill-0"]
    assert fd["vip"] == {"address": "10.89.64.200", "prefix": 32, "virtual_router_id": 39, "interface": None}
    assert fd["url"] == "https://10.89.64.200:8443"
    assert [r["host"] for r in plan["routers"]] == ["lab-decode-0", "lab-prefill-0"]


def test_two_front_doors_need_a_virtual_address():
    with pytest.raises(topology.PlanError, match="2 front-door hosts .lab-decode-0, lab-prefill-0. need pdctl_frontdoor_vip"):
        topology.build_plan(_lab_hosts(router=["lab-prefill-0"]))


@pytest.mark.parametrize("vip,expected", [
    ({"address": "10.89.64.11", "virtual_router_id": 39}, "clashes with lab-prefill-0's own address"),
    ({"address": "vip.example", "virtual_router_id": 39}, "is not an IP address"),
    ({"address": "10.89.64.200", "virtual_router_id": 300}, "virtual_router_id must be 1..255"),
    ({"address": "10.89.64.200"}, "virtual_router_id must be 1..255"),
    ({"address": "10.89.64.200", "virtual_router_id": 39, "prefix": 33}, "prefix must be 1..32"),
    ({"address": "10.89.64.200", "virtual_router_id": 39, "vrid": 1}, "must be {address"),
])
def test_a_bad_virtual_address_is_refused(vip, expected):
    with pytest.raises(topology.PlanError, match=re.escape(expected)):
        topology.build_plan(_with_vip(_lab_hosts(router=["lab-prefill-0"]), vip))


def test_front_door_hosts_must_agree_on_the_virtual_address():
    hosts = _with_vip(_lab_hosts(router=["lab-prefill-0"]))
    hosts["lab-prefill-0"]["vars"]["pdctl_frontdoor_vip"] = {"address": "10.89.64.201", "virtual_router_id": 39}
    with pytest.raises(topology.PlanError, match="front-door hosts disagree on pdctl_frontdoor_vip"):
        topology.build_plan(hosts)


def test_table_shows_every_router_and_the_front_door():
    text = topology.format_table(topology.build_plan(_with_vip(_lab_hosts(router=["lab-prefill-1"]))))
    assert "front door: https://10.89.64.200:8443 on lab-decode-0, lab-prefill-1 (metrics :8405)" in text
    assert "router: http://10.89.64.13:8000 on lab-decode-0 (metrics :29000)" in text
    assert "router: http://10.89.64.12:8000 on lab-prefill-1 (metrics :29000)" in text


# ---------------------------------------------------------------- unknown top-level variables (issue 37)

def _inventory_names(inv):
    """Every top-level pdctl_* name the inventory's group_vars define."""
    import yaml
    names = set()
    for path in (ROOT / "inventories" / inv / "group_vars").rglob("*.yml"):
        names |= {k for k in (yaml.safe_load(path.read_text()) or {}) if k.startswith("pdctl_")}
    return names


@pytest.mark.parametrize("inv", ["b300", "lab"])
def test_every_variable_the_inventories_define_is_read_somewhere(inv):
    """The known names come from the code that reads them (roles, playbooks, plugins, src/pdctl), not from a
    list kept by hand; every name the inventories set is among them or read by the inventory itself."""
    from ansible_collections.pdctl.vllm_pd.plugins.module_utils import varnames
    known = varnames.known_variables()
    hosts = inventory.load(ROOT / "inventories" / inv)
    unread = {n for h in hosts.values() for n in h["names"]}
    assert not (_inventory_names(inv) - known) & unread, "names neither the code nor the inventory reads"
    assert not varnames.unknown_variables({h: v["names"] for h, v in hosts.items()}, known)
    assert set(topology.PLAN_VARS) - {"ansible_host"} <= known


def test_a_name_only_the_inventory_reads_is_not_unknown():
    from ansible_collections.pdctl.vllm_pd.plugins.module_utils import varnames
    raw = {"pdctl_lab_dir": "/x", "pdctl_api_key": "{{ lookup('file', pdctl_lab_dir ~ '/key') }}",
           "pdctl_min_prefill_instance": 2}
    assert varnames.unread_names(raw) == ["pdctl_api_key", "pdctl_min_prefill_instance"]
    problems = varnames.unknown_variables({"h1": varnames.unread_names(raw)}, varnames.known_variables())
    assert problems == ["unknown variable pdctl_min_prefill_instance on h1: no role, playbook or plugin reads it "
                        "(did you mean pdctl_min_prefill_instances?)"]


def test_the_plan_filter_refuses_a_misspelled_variable_and_not_the_inventorys_own_helpers(tmp_path):
    """Through Ansible (preflight's filter): the host's untemplated variables tell which pdctl_* names the
    inventory's own templates read (pdctl_lab_dir), so only the misspelling is refused."""
    from test_role_tasks import ANSIBLE_PLAYBOOK
    book = tmp_path / "play.yml"
    book.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.debug:\n"
                    "        msg: \"{{ (hostvars | pdctl.vllm_pd.plan(groups)).errors | to_json }}\"\n"
                    "      run_once: true\n      delegate_to: localhost\n")
    for overrides, errors in (({}, []), ({"group_vars/all": {"pdctl_min_prefill_instance": 2}}, [
            "unknown variable pdctl_min_prefill_instance on lab-decode-0, lab-prefill-0, lab-prefill-1: no role, "
            "playbook or plugin reads it (did you mean pdctl_min_prefill_instances?)"])):
        inv = inventory_variant(tmp_path / ("inv%d" % len(errors)), overrides)
        res = subprocess.run([ANSIBLE_PLAYBOOK, str(book), "-i", str(inv)], cwd=ROOT, capture_output=True, text=True,
                             env={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": "/usr/bin:/bin",
                                  "HOME": str(tmp_path), "ANSIBLE_STDOUT_CALLBACK": "json"})
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        task = json.loads(res.stdout)["plays"][0]["tasks"][0]
        assert json.loads(next(iter(task["hosts"].values()))["msg"]) == errors


def _kv_check_listeners(plan, host, base, gpus="per_numa"):
    return [p["port"] for p in topology.kv_check_paths(plan, base, gpus) if p["prefill_host"] == host]


def test_kv_path_check_ports_clash_over_the_whole_listener_range():
    # The KV-path check opens one listener per checked path on a prefill host, from its base port up:
    # a port inside that range clashes, not only one equal to the base.
    hosts = _lab_hosts()
    base = hosts["lab-prefill-0"]["vars"]["pdctl_ports"]["kv_path_check"]
    ports = _kv_check_listeners(topology.build_plan(hosts), "lab-prefill-0", base)
    assert len(ports) > 1 and ports == list(range(base, base + len(ports)))
    _set_ports(hosts, "lab-prefill-0", model_fanout=ports[-1])
    with pytest.raises(topology.PlanError, match=r"lab-prefill-0: port clash: kv_path_check port range \(%d KV-path "
                                                 r"check listeners\) %d-%d overlaps model_fanout port %d"
                                                 % (len(ports), base, ports[-1], ports[-1])):
        topology.build_plan(hosts)
    # One port past the range is free.
    hosts = _lab_hosts()
    _set_ports(hosts, "lab-prefill-0", model_fanout=ports[-1] + 1)
    assert topology.build_plan(hosts)["instances"]


def test_kv_path_check_range_follows_the_checked_gpus():
    # gpus: all checks every GPU of each prefill instance: a wider range, so a port that was free clashes.
    hosts = _lab_hosts()
    base = hosts["lab-prefill-0"]["vars"]["pdctl_ports"]["kv_path_check"]
    plan = topology.build_plan(hosts)
    per_numa, every = (_kv_check_listeners(plan, "lab-prefill-0", base, g) for g in ("per_numa", "all"))
    assert len(every) > len(per_numa)
    _set_ports(hosts, "lab-prefill-0", model_fanout=every[-1])
    assert topology.build_plan(hosts)["instances"]
    for host in ("lab-prefill-0", "lab-prefill-1"):
        hosts[host]["vars"]["pdctl_kv_path_check"] = dict(hosts[host]["vars"]["pdctl_kv_path_check"], gpus="all")
    with pytest.raises(topology.PlanError, match=r"lab-prefill-0: port clash: kv_path_check port range .* "
                                                 r"overlaps model_fanout port %d" % every[-1]):
        topology.build_plan(hosts)
    hosts["lab-prefill-1"]["vars"]["pdctl_kv_path_check"]["gpus"] = "some"
    with pytest.raises(topology.PlanError, match="lab-prefill-1: pdctl_kv_path_check.gpus must be one of"):
        topology.build_plan(hosts)


def test_kv_path_check_range_clashes_with_instance_and_monitoring_ports():
    hosts = _lab_hosts()
    base = hosts["lab-prefill-0"]["vars"]["pdctl_ports"]["kv_path_check"]
    last = _kv_check_listeners(topology.build_plan(hosts), "lab-prefill-0", base)[-1]
    # An instance's API port inside the range.
    _set_ports(hosts, "lab-prefill-0", kv_path_check=hosts["lab-prefill-0"]["vars"]["pdctl_ports"]["api_base"]
               - (last - base))
    with pytest.raises(topology.PlanError, match=r"lab-prefill-0: port clash: kv_path_check port range .* "
                                                 r"overlaps prefill-0 API port"):
        topology.build_plan(hosts)
    # The node exporter and the DCGM exporter inside the range.
    for key, change, label in (("node_exporter_port", {"node_exporter_port": last}, "node exporter port"),
                               ("dcgm_exporter.port", {"dcgm_exporter": {"enabled": True, "port": last}},
                                "DCGM exporter port")):
        hosts = _lab_hosts()
        hosts["lab-prefill-0"]["vars"]["pdctl_monitoring"] = dict(hosts["lab-prefill-0"]["vars"]["pdctl_monitoring"],
                                                                  **change)
        with pytest.raises(topology.PlanError, match=r"lab-prefill-0: port clash: kv_path_check port range .* "
                                                     r"overlaps %s \(pdctl_monitoring.%s\) %d" % (label, key, last)):
            topology.build_plan(hosts)


def test_kv_path_check_range_counts_only_on_prefill_hosts():
    # The listeners run on the prefill hosts: on the decode host only the base port is held (as before).
    hosts = _lab_hosts()
    base = hosts["lab-decode-0"]["vars"]["pdctl_ports"]["kv_path_check"]
    _set_ports(hosts, "lab-decode-0", model_fanout=base + 1)
    assert topology.build_plan(hosts)["instances"]
