"""The host firewall from the plan (plugins/module_utils/firewall.py, roles/firewall): who may reach which
port on the lab and production plans, nothing unplanned open, the rendered nftables file accepted by
`nft -c` and applied without touching other tables, the role's safety and the lab hosts' capability.

The expectations are written out by hand from the inventories (addresses, port bases), not derived
from the code under test."""
from __future__ import annotations

import subprocess

import pytest
import yaml

import requires
from inventories import B300 as B300_INVENTORY, ROOT, inventory_variant
from pdctl import cli, inventory
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import firewall

LAB = {"lab-prefill-0": "10.89.64.11", "lab-prefill-1": "10.89.64.12", "lab-decode-0": "10.89.64.13"}
B300 = {"b300-prefill-0": "192.0.2.11", "b300-prefill-1": "192.0.2.12", "b300-decode-0": "192.0.2.13"}
CONTROLLER = "10.89.64.1"
OUTSIDER = "10.89.64.50"          # on the lab network, in no inventory
EPHEMERAL = range(32768, 61000)


def lab_inputs(**over):
    inputs = {"addresses": {h: [a] for h, a in LAB.items()}, "admin_networks": ["10.89.64.1/32"],
              "client_networks": ["10.89.64.0/24"], "ssh_port": 22, "monitoring_host": "lab-decode-0",
              "prometheus_port": 9090, "node_exporter_port": 9100, "dcgm_exporter_port": 9400,
              "ucx_environment": {}, "kv_check_port": 5690, "kv_check_gpus": "per_numa", "model_fanout_port": 8790}
    inputs.update(over)
    return inputs


def b300_inputs(**over):
    inputs = {"addresses": {h: [a] for h, a in B300.items()}, "admin_networks": ["203.0.113.0/24"],
              "client_networks": ["198.51.100.0/24"], "ssh_port": 22, "monitoring_host": "b300-decode-0",
              "prometheus_port": 9090, "node_exporter_port": 9100, "dcgm_exporter_port": 9400,
              "ucx_environment": {"UCX_TLS": "rc,cuda_copy,cuda_ipc"}, "kv_check_port": 5690,
              "kv_check_gpus": "per_numa", "model_fanout_port": 8790}
    inputs.update(over)
    return inputs


@pytest.fixture(scope="module")
def lab_plan(tmp_path_factory):
    """The lab with one router and front door (on lab-decode-0): most rules are easiest to read there."""
    return variant_plan(tmp_path_factory.mktemp("one-router"), ["lab-decode-0"], ["lab-decode-0"])


@pytest.fixture(scope="module")
def lab_two_plan():
    """The lab inventory as it is: routers and front doors on lab-decode-0 and lab-prefill-0, one virtual address."""
    return inventory.plan(ROOT / "inventories/lab")


@pytest.fixture(scope="module")
def b300_plan():
    return inventory.plan(B300_INVENTORY)


def variant_plan(tmp_path, routers, frontdoors):
    """The lab plan with other router and front-door groups, from the planner."""
    hosts = yaml.safe_load((ROOT / "inventories/lab/hosts.yml").read_text())
    groups = hosts["all"]["children"]
    groups["router"] = {"hosts": {h: None for h in routers}}
    groups["frontdoor"] = {"hosts": {h: None for h in frontdoors}}
    return inventory.plan(inventory_variant(tmp_path / "inv", {"hosts": hosts}))


def who(rules, host, port, sources):
    """The sources among `sources` that host accepts TCP `port` from."""
    return {s for s in sources if firewall.allowed(rules[host], port, s)}


def reachable(host_rules, source):
    """Every TCP port span host_rules accept from source."""
    return sorted({span for r in host_rules if r.get("proto") == "tcp" and r["action"] == "accept"
                   and firewall.address_in_networks(source, r["sources"]) for span in r["ports"]})


def open_ports(host_rules):
    return sorted({span for r in host_rules if r.get("proto") == "tcp" for span in r["ports"]})


EVERYONE = set(LAB.values()) | {CONTROLLER, OUTSIDER}


# -- the lab plan -------------------------------------------------------------------------------------

def test_lab_instance_api_ports_only_from_the_router_host_and_their_own(lab_plan):
    # Generation endpoints without a key (POST /invocations): not even the controller (admin network)
    # reaches them; Prometheus scrapes /metrics from the router host.
    rules = firewall.rules(lab_plan, lab_inputs())
    assert who(rules, "lab-decode-0", 8100, EVERYONE) == {"10.89.64.13"}
    for port in (8100, 8101):
        assert who(rules, "lab-prefill-0", port, EVERYONE) == {"10.89.64.13", "10.89.64.11"}
        assert who(rules, "lab-prefill-1", port, EVERYONE) == {"10.89.64.13", "10.89.64.12"}


def test_prometheus_off_the_router_hosts_is_refused(lab_plan):
    with pytest.raises(firewall.FirewallError, match="lab-prefill-0 is not a router host"):
        firewall.rules(lab_plan, lab_inputs(monitoring_host="lab-prefill-0"))


def test_lab_side_channels_only_from_the_hosts_that_pull_kv(lab_plan):
    # A prefill instance's: the decode host, and the other prefill host, whose instance may lend its GPUs to a
    # temporary decode that pulls from every other prefill instance (a decode change, the decode host's turn).
    rules = firewall.rules(lab_plan, lab_inputs())
    for port in (5600, 5603, 5604, 5607):          # prefill-0/2: 5600-5603, prefill-1/3: 5604-5607 (DP4 each)
        assert who(rules, "lab-prefill-0", port, EVERYONE) == {"10.89.64.13", "10.89.64.12"}
        assert who(rules, "lab-prefill-1", port, EVERYONE) == {"10.89.64.13", "10.89.64.11"}
    for port in (5600, 5607):                      # decode-0: DP8
        assert who(rules, "lab-decode-0", port, EVERYONE) == {"10.89.64.11", "10.89.64.12"}
    assert who(rules, "lab-decode-0", 5608, EVERYONE) == set()


def test_lab_dp_rpc_ports_only_from_the_host_itself(lab_plan):
    rules = firewall.rules(lab_plan, lab_inputs())
    assert who(rules, "lab-prefill-0", 13345, EVERYONE) == {"10.89.64.11"}
    assert who(rules, "lab-prefill-0", 13346, EVERYONE) == {"10.89.64.11"}
    assert who(rules, "lab-prefill-1", 13346, EVERYONE) == {"10.89.64.12"}
    assert who(rules, "lab-decode-0", 13345, EVERYONE) == {"10.89.64.13"}


def test_lab_kv_over_tcp_opens_ephemeral_ports_between_kv_peers_only(lab_plan):
    # No RDMA in the lab: UCX moves KV over TCP on ephemeral ports, in both directions; between prefill hosts
    # too (a temporary decode on one of them).
    rules = firewall.rules(lab_plan, lab_inputs())
    for port in (32768, 45000, 60999):
        assert who(rules, "lab-prefill-0", port, EVERYONE) == {"10.89.64.13", "10.89.64.12"}
        assert who(rules, "lab-prefill-1", port, EVERYONE) == {"10.89.64.13", "10.89.64.11"}
        assert who(rules, "lab-decode-0", port, EVERYONE) == {"10.89.64.11", "10.89.64.12"}
    assert who(rules, "lab-decode-0", 61000, EVERYONE) == set()
    # The KV-path check's listeners: one per checked prefill GPU (per socket: 2 per prefill host).
    assert who(rules, "lab-prefill-0", 5690, EVERYONE) == who(rules, "lab-prefill-0", 5691, EVERYONE) == {"10.89.64.13"}
    assert who(rules, "lab-prefill-0", 5692, EVERYONE) == set()


def test_lab_ssh_and_monitoring(lab_plan):
    rules = firewall.rules(lab_plan, lab_inputs())
    for host in LAB:
        assert who(rules, host, 22, EVERYONE) == {CONTROLLER}
        assert who(rules, host, 9100, EVERYONE) == {CONTROLLER, "10.89.64.13"}     # node exporter
        assert who(rules, host, 9400, EVERYONE) == {CONTROLLER, "10.89.64.13"}     # the DCGM exporter stand-in
    assert who(rules, "lab-decode-0", 9090, EVERYONE) == {CONTROLLER}             # Prometheus itself
    assert who(rules, "lab-prefill-0", 9090, EVERYONE) == set()
    assert who(rules, "lab-decode-0", 29000, EVERYONE) == {CONTROLLER, "10.89.64.13"}   # router metrics


def test_lab_model_fanout_between_serving_hosts(lab_plan):
    rules = firewall.rules(lab_plan, lab_inputs())
    assert who(rules, "lab-prefill-0", 8790, EVERYONE) == {"10.89.64.12", "10.89.64.13"}
    assert who(rules, "lab-decode-0", 8790, EVERYONE) == {"10.89.64.11", "10.89.64.12"}


def test_lab_open_ports_are_exactly_the_planned_ones(lab_plan):
    rules = firewall.rules(lab_plan, lab_inputs())
    common = ["22", "32768-60999", "8790", "9100", "9400"]
    assert open_ports(rules["lab-prefill-0"]) == sorted(common + ["8100", "8101", "5600-5603", "5604-5607",
                                                                  "13345", "13346", "5690-5691"])
    assert open_ports(rules["lab-prefill-1"]) == open_ports(rules["lab-prefill-0"])
    # The front door beside the router: the router listens on 127.0.0.1, its port is open to no one.
    # 29002: the aggregated router's metrics (degraded mode, docs/decode-loss.md); it listens on 127.0.0.1 too.
    assert open_ports(rules["lab-decode-0"]) == sorted(common + ["8100", "5600-5607", "13345", "29000", "29001",
                                                                 "29002", "8443", "8405", "9090"])
    assert who(rules, "lab-decode-0", 8000, EVERYONE) == set()
    assert who(rules, "lab-decode-0", 8002, EVERYONE) == set()


def test_an_unplanned_port_is_not_open_to_anyone(lab_plan):
    rules = firewall.rules(lab_plan, lab_inputs())
    for host in LAB:
        for port in (1, 21, 80, 443, 3306, 5599, 5608, 8001, 8102, 8406, 13347, 29003, 32767, 61000, 65535):
            assert who(rules, host, port, EVERYONE) == set(), (host, port)
    for host in ("lab-prefill-0", "lab-prefill-1"):
        assert who(rules, host, 8443, EVERYONE) == who(rules, host, 29000, EVERYONE) == set()


def test_the_outsider_reaches_the_front_door_port_and_nothing_else(lab_plan):
    rules = firewall.rules(lab_plan, lab_inputs())
    for host in LAB:
        assert reachable(rules[host], OUTSIDER) == (["8443"] if host == "lab-decode-0" else []), host


# -- routers and front door (issue 14's plan keys) ----------------------------------------------------

def test_front_door_beside_a_loopback_router(lab_plan):
    rules = firewall.rules(lab_plan, lab_inputs())
    assert lab_plan["routers"][0]["bind"] == "127.0.0.1"
    assert who(rules, "lab-decode-0", 8000, EVERYONE) == set()
    assert who(rules, "lab-decode-0", 8443, EVERYONE) == EVERYONE       # 10.89.64.0/24 are the clients
    assert not firewall.allowed(rules["lab-decode-0"], 8443, "10.89.65.7")
    assert who(rules, "lab-decode-0", 8405, EVERYONE) == {CONTROLLER, "10.89.64.13"}


def test_two_routers_behind_a_separate_front_door(tmp_path):
    plan = variant_plan(tmp_path, ["lab-decode-0", "lab-prefill-0"], ["lab-prefill-1"])
    rules = firewall.rules(plan, lab_inputs())
    for router in ("lab-decode-0", "lab-prefill-0"):
        assert who(rules, router, 8000, EVERYONE) == {"10.89.64.12"}    # the front-door host only
        assert who(rules, router, 8002, EVERYONE) == {"10.89.64.12"}    # its aggregated router too
        assert who(rules, router, 8443, EVERYONE) == set()
        assert who(rules, router, 29000, EVERYONE) == {CONTROLLER, "10.89.64.13"}
    assert who(rules, "lab-prefill-1", 8443, EVERYONE) == EVERYONE
    assert who(rules, "lab-prefill-1", 8405, EVERYONE) == {CONTROLLER, "10.89.64.13"}
    assert who(rules, "lab-prefill-1", 8000, EVERYONE) == set()
    # Both routers reach every instance.
    assert who(rules, "lab-prefill-1", 8100, EVERYONE) == {"10.89.64.13", "10.89.64.11", "10.89.64.12"}
    # The decode's too, and the front-door host, whose checks ask the decode's /health (haproxy.cfg.j2).
    assert who(rules, "lab-decode-0", 8100, EVERYONE) == {"10.89.64.13", "10.89.64.11", "10.89.64.12"}


def test_no_client_network_closes_the_front_door(lab_plan):
    rules = firewall.rules(lab_plan, lab_inputs(client_networks=[]))
    assert who(rules, "lab-decode-0", 8443, EVERYONE) == set()


# -- production --------------------------------------------------------------------------------------

def test_b300_rules(b300_plan):
    rules = firewall.rules(b300_plan, b300_inputs())
    every = set(B300.values()) | {"203.0.113.9", "198.51.100.9", "192.0.2.99"}
    admin = "203.0.113.9"
    assert who(rules, "b300-decode-0", 8100, every) == {"192.0.2.13", "192.0.2.11"}  # the router hosts only
    assert who(rules, "b300-prefill-0", 8101, every) == {"192.0.2.13", "192.0.2.11"}
    assert who(rules, "b300-prefill-1", 5607, every) == {"192.0.2.13", "192.0.2.11"}  # decode, the other prefill host
    assert who(rules, "b300-prefill-0", 5600, every) == {"192.0.2.13", "192.0.2.12"}
    assert who(rules, "b300-decode-0", 5600, every) == {"192.0.2.11", "192.0.2.12"}
    assert who(rules, "b300-prefill-1", 13346, every) == {"192.0.2.12"}
    for host in B300:
        assert who(rules, host, 22, every) == {admin}
        assert who(rules, host, 9400, every) == {admin, "192.0.2.13"}          # DCGM exporter
        # RDMA (UCX_TLS without tcp): the KV data path is not IP, no ephemeral range is opened.
        assert who(rules, host, 40000, every) == set()
    assert who(rules, "b300-prefill-0", 5690, every) == {"192.0.2.13"}
    assert who(rules, "b300-prefill-0", 5691, every) == {"192.0.2.13"}
    assert who(rules, "b300-decode-0", 9090, every) == {admin}
    # The front door, to the clients and the other front-door host (which checks the virtual address).
    assert who(rules, "b300-decode-0", 443, every) == {"198.51.100.9", "192.0.2.11"}
    assert who(rules, "b300-prefill-1", 443, every) == set()
    assert who(rules, "b300-decode-0", 8405, every) == {admin, "192.0.2.13"}
    # Two front doors: each router listens on its address, for the front-door hosts only.
    assert who(rules, "b300-decode-0", 8000, every) == {"192.0.2.13", "192.0.2.11"}
    assert vrrp_sources(rules) == {"b300-decode-0": ["192.0.2.11"], "b300-prefill-0": ["192.0.2.13"],
                                   "b300-prefill-1": None}


def vrrp_sources(rules):
    """{host: the sources its VRRP rule accepts (None: no such rule)}."""
    out = {}
    for host, host_rules in rules.items():
        found = [r for r in host_rules if r.get("proto") == "vrrp"]
        out[host] = found[0]["sources"] if found else None
    return out


def test_lab_vrrp_between_the_front_door_hosts_only(lab_two_plan, lab_plan):
    rules = firewall.rules(lab_two_plan, lab_inputs())
    assert vrrp_sources(rules) == {"lab-decode-0": ["10.89.64.11"], "lab-prefill-0": ["10.89.64.13"],
                                   "lab-prefill-1": None}
    for host in ("lab-decode-0", "lab-prefill-0"):
        assert who(rules, host, 8443, EVERYONE) == EVERYONE                  # clients reach the address
        assert who(rules, host, 8000, EVERYONE) == {"10.89.64.13", "10.89.64.11"}
    assert who(rules, "lab-prefill-1", 8443, EVERYONE) == set()
    # One front door: no VRRP rule (the address, if any, never moves).
    assert vrrp_sources(firewall.rules(lab_plan, lab_inputs()))["lab-decode-0"] is None


def test_rendered_vrrp_rule_checks_with_nft(rendered):
    nft = requires.binary("nft", "the rendered rules are checked by nft itself")
    for inv, host, peer in (("lab", "lab-decode-0", "10.89.64.11"), ("b300", "b300-prefill-0", "192.0.2.13")):
        path = rendered[inv] / host / "etc/nftables.conf"
        assert 'ip saddr { %s } meta l4proto 112 accept comment "vrrp"' % peer in path.read_text()
        res = subprocess.run([nft, "-c", "-f", str(path)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr


def test_ucx_tcp_decides_the_kv_range():
    assert firewall.ucx_uses_tcp({})
    assert firewall.ucx_uses_tcp({"UCX_TLS": "all"})
    assert firewall.ucx_uses_tcp({"UCX_TLS": "tcp,cuda_copy"})
    assert firewall.ucx_uses_tcp({"UCX_TLS": "^ib"})
    assert not firewall.ucx_uses_tcp({"UCX_TLS": "^tcp"})
    assert not firewall.ucx_uses_tcp({"UCX_TLS": "rc,cuda_copy,cuda_ipc"})


# -- safety and inputs -------------------------------------------------------------------------------

def test_no_admin_network_is_refused(lab_plan):
    with pytest.raises(firewall.FirewallError, match="SSH would be closed"):
        firewall.rules(lab_plan, lab_inputs(admin_networks=[]))


def test_bad_inputs_are_named(lab_plan):
    addresses = dict(lab_inputs()["addresses"], **{"lab-prefill-1": ["prefill-1.example"]})
    with pytest.raises(firewall.FirewallError) as err:
        firewall.rules(lab_plan, lab_inputs(admin_networks=["10.89.64.300/32"], addresses=addresses))
    text = str(err.value)
    assert "10.89.64.300/32" in text and "lab-prefill-1" in text


def test_host_addresses_take_ip_literals_only():
    assert firewall.host_addresses({"ansible_host": "10.0.0.5", "pdctl_advertise_address": "10.1.0.5"}) == \
        ["10.1.0.5", "10.0.0.5"]
    assert firewall.host_addresses({"ansible_host": "node.example"}) == []
    assert firewall.host_addresses({"ansible_host": "10.0.0.5", "pdctl_firewall_addresses": ["10.2.0.5"]}) == \
        ["10.2.0.5"]
    assert firewall.address_in_networks("10.89.64.1", ["10.89.64.1/32"])
    assert not firewall.address_in_networks("10.89.64.2", ["10.89.64.1/32"])
    assert not firewall.address_in_networks("", ["0.0.0.0/0"])


# -- the rendered file (the role's template and filter, through `pdctl render`) ------------------------

@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = {}
    for inv in ("lab", "b300"):
        d = tmp_path_factory.mktemp("render-" + inv)
        path = B300_INVENTORY if inv == "b300" else ROOT / "inventories" / inv
        assert cli.main(["render", "-i", str(path), "--out", str(d)]) == 0
        out[inv] = d
    return out


def _netns(script):
    """Run a shell script in a network namespace of its own (nft there touches nothing of this machine's)."""
    unshare = requires.binary("unshare", "runs nft in a network namespace of its own (util-linux)")
    requires.binary("nft", "checks the rendered firewall (apt package nftables, installed by scripts/bootstrap)")
    return subprocess.run([unshare, "-n", "sh", "-ec", script], capture_output=True, text=True)


def test_rendered_rules_pass_nft_check(rendered):
    files = sorted(p for d in rendered.values() for p in d.glob("*/etc/nftables.conf"))
    assert len(files) == 6
    for path in files:
        res = _netns("nft -c -f %s" % path)
        assert res.returncode == 0, "%s: %s" % (path, res.stderr)


def test_rendered_rules_replace_only_their_own_table(rendered):
    path = rendered["lab"] / "lab-decode-0/etc/nftables.conf"
    res = _netns("nft add table inet other; nft add chain inet other c; nft -f %s; nft -f %s; nft list ruleset"
                 % (path, path))
    assert res.returncode == 0, res.stderr
    listing = res.stdout
    assert "table inet other" in listing, "applying the rules removed another table"
    assert listing.count("table inet pdctl") == 1
    assert "policy drop;" in listing
    assert 'ip saddr { 10.89.64.11, 10.89.64.13 } tcp dport 8100 accept comment "decode-0 api"' in listing
    assert 'ip saddr 10.89.64.11 meta l4proto vrrp accept comment "vrrp"' in listing


def test_rendered_lab_file_names_each_rule(rendered):
    text = (rendered["lab"] / "lab-prefill-0/etc/nftables.conf").read_text()
    assert "ip saddr { 10.89.64.12, 10.89.64.13 } tcp dport { 5600-5603 } accept" in text
    assert "ip saddr { 10.89.64.11 } tcp dport { 13345 } accept" in text
    assert "UCX" in text and "32768-60999" in text
    b300 = (rendered["b300"] / "b300-prefill-0/etc/nftables.conf").read_text()
    assert "32768-60999" not in b300


# -- the role and the lab ----------------------------------------------------------------------------

ROLE = ROOT / "roles/firewall"


def test_os_vars_declare_nftables_which_the_lab_stages():
    from pdctl.lab import store

    for os_name in ("Debian", "Ubuntu"):
        data = yaml.safe_load((ROLE / "vars" / ("%s.yml" % os_name)).read_text())
        assert data["firewall_packages"] == ["nftables"]
    assert "nftables" in store.declared_debian_packages()
    assert "nftables" in (ROOT / "scripts/bootstrap").read_text().split("APT_PACKAGES=(")[1].split(")")[0].split()


def test_role_checks_before_writing_and_applies_atomically():
    tasks = {t["name"]: t for t in yaml.safe_load((ROLE / "tasks/0020-rules.yml").read_text())}
    template = next(t for t in tasks.values() if "ansible.builtin.template" in t)
    assert template["ansible.builtin.template"]["validate"] == "nft -c -f %s"
    assert template["notify"] == "Apply the firewall rules"
    names = list(tasks)
    assert names.index("The rules keep SSH open to the controller") < names.index(template["name"])
    (handler,) = yaml.safe_load((ROLE / "handlers/main.yml").read_text())
    assert handler["ansible.builtin.command"] == "nft -f {{ firewall_config_file }}"
    text = (ROLE / "templates/nftables.conf.j2").read_text()
    assert "flush ruleset" not in text and "delete table inet pdctl" in text


def test_site_runs_the_firewall_before_anything_listens():
    # After host_base (apt points at the store that holds nftables), before every play that starts a
    # listener: a port is admitted from the planned hosts before it opens, never open to all meanwhile.
    plays = yaml.safe_load((ROOT / "playbooks/site.yml").read_text())
    order = [p.get("tags", [None])[0] for p in plays]
    fw = order.index("firewall")
    assert order.index("host_base") < fw
    for later in ("model_weights", "vllm", "router", "frontdoor", "monitoring"):
        assert fw < order.index(later), later
    assert set(plays[fw]["hosts"].split(":")) == {"serving", "router", "frontdoor"}


def test_lab_hosts_get_net_admin_and_are_recreated_when_their_options_change(tmp_path, monkeypatch):
    from pdctl.lab import hosts, image, stage, store

    calls = []
    labels = {"io.pdctl.lab.dir": str(tmp_path), "io.pdctl.lab.options": "an-older-digest"}
    monkeypatch.setattr(hosts, "lab_dir", lambda: tmp_path)
    monkeypatch.setattr(hosts, "lab_hosts", lambda inv=None: [hosts.LabHost("lab-x", "10.89.64.60")])
    monkeypatch.setattr(hosts, "container_options", lambda: [])
    monkeypatch.setattr(hosts.shutil, "which", lambda tool: "/usr/bin/" + tool)
    monkeypatch.setattr(hosts, "_ssh_key", lambda: tmp_path / "id")
    monkeypatch.setattr(image, "ensure", lambda opts: "localhost/pdctl-lab:t")
    monkeypatch.setattr(hosts, "_ensure_network", lambda: None)
    monkeypatch.setattr(hosts, "_container_state", lambda name: "running")
    monkeypatch.setattr(hosts, "_container_label", lambda name, label: labels[label])
    monkeypatch.setattr(hosts, "_forget_host_key", lambda host: None)
    monkeypatch.setattr(hosts, "_wait_ssh", lambda *a, **k: None)
    monkeypatch.setattr(store, "ensure_started", lambda d: None)
    monkeypatch.setattr(stage, "ensure_wheels", lambda *a: None)
    monkeypatch.setattr(stage, "stage_all", lambda *a, **k: {})
    monkeypatch.setattr(hosts, "run", lambda cmd, **kw: calls.append(cmd))

    assert hosts.up() == 0
    (rm,) = [c for c in calls if c[:2] == ["podman", "rm"]]
    (start,) = [c for c in calls if c[:2] == ["podman", "run"]]
    assert "--cap-add" in start and start[start.index("--cap-add") + 1] == "NET_ADMIN"
    digest = hosts.options_digest(hosts.HOST_OPTIONS)
    assert "io.pdctl.lab.options=%s" % digest in start

    # Started with these options already: left running.
    calls.clear()
    labels["io.pdctl.lab.options"] = digest
    assert hosts.up() == 0
    assert not [c for c in calls if c[:2] in (["podman", "rm"], ["podman", "run"])]


def test_ssh_stays_open_on_the_port_ansible_reaches_the_host_on(tmp_path):
    """A host reached on another SSH port (ansible_port) keeps that port open to the admin networks, and 22 closed:
    a fixed 22 would lock Ansible out of it at the firewall's next apply."""
    inv = inventory_variant(tmp_path / "inv", {"host_vars/b300-prefill-1": {"ansible_port": 2222}}, base="b300")
    assert cli.main(["render", "-i", str(inv), "--out", str(tmp_path / "out")]) == 0
    nft = (tmp_path / "out" / "b300-prefill-1" / "etc" / "nftables.conf").read_text()
    ssh = [line for line in nft.splitlines() if "dport" in line and ("2222" in line or " 22 " in line)]
    assert ssh and all("2222" in line for line in ssh), ssh
