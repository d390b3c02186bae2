"""roles/frontdoor: the HAProxy configuration `pdctl render` writes from the lab and production plans
passes `haproxy -c` and holds the planned limits and routers; the clients map holds only key hashes;
the OS vars declare the package the lab stages."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import shutil

import pytest
import yaml
from pathlib import Path

import requires
from self_signed import self_signed
from inventories import ROOT
from pdctl import cli, inventory
from pdctl.lab import store

ROLE = ROOT / "roles/frontdoor"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = {}
    for inv in ("b300", "lab"):
        d = tmp_path_factory.mktemp(inv)
        assert cli.main(["render", "-i", str(ROOT / "inventories" / inv), "--out", str(d)]) == 0
        out[inv] = d
    return out


def _cfg(rendered, inv):
    plan = inventory.plan(ROOT / "inventories" / inv)
    host = plan["frontdoor"]["hosts"][0]
    return plan, (rendered[inv] / host / "etc/haproxy/haproxy.cfg").read_text()


@pytest.mark.parametrize("inv,port,inflight", [("lab", 8443, 16), ("b300", 443, 64)])
def test_rendered_config_holds_the_plan(rendered, inv, port, inflight):
    plan, text = _cfg(rendered, inv)
    assert re.search(r"^\s+bind :%d ssl crt /etc/haproxy/pdctl/frontdoor.pem" % port, text, re.M)
    assert re.search(r"^\s+bind :8405$", text, re.M)
    assert "use-service prometheus-exporter" in text
    # Two front-door hosts behind one virtual address: only its holder takes clients, so each admits the
    # whole limit; the queue is bounded.
    assert re.search(r"server admission abns@pdctl-routers maxconn %d maxqueue %d$" % (inflight, 2 * inflight), text, re.M)
    # Admission follows capacity (issue 41): the queue bound is a variable the runtime API changes like the
    # server's maxconn; a request is refused at once only when no slot is free and the queue is at its bound.
    assert re.search(r"^\s+set-var proc.pdctl_admission_queue int\(%d\)$" % (2 * inflight), text, re.M)
    assert "acl be_admission_full srv_conn_free(be_admission/admission) le 0" in text
    assert "acl be_admission_full_queue queue(be_admission),sub(proc.pdctl_admission_queue) ge 0" in text
    # Degraded mode: while no P/D router (its check: the router and its decode) nor standby is up, requests go
    # through an admission of their own, half the limits (the prefill instances also decode).
    assert re.findall(r"^backend (be_admission\S*)\n\s+server admission abns@pdctl-routers maxconn (\d+) maxqueue (\d+)$",
                      text, re.M) == [("be_admission", str(inflight), str(2 * inflight)),
                                      ("be_admission_degraded", str(inflight // 2), str(2 * inflight))]
    assert re.search(r"^\s+set-var proc.pdctl_admission_degraded_queue int\(%d\)$" % inflight, text, re.M)
    assert re.findall(r"^\s+acl pd_router_up srv_is_up\((\S+)\)$", text, re.M) == [
        x % r["host"] for r in plan["routers"] for x in ("be_check_%s/router", "be_routers/%s-standby")]
    assert "use_backend be_admission_degraded if !pd_router_up" in text
    assert ("if pd_router_up be_admission_full be_admission_full_queue || "
            "!pd_router_up be_admission_degraded_full be_admission_degraded_full_queue") in text
    # This host's P/D router, then (degraded mode, issue 39) its aggregated router, then the other router
    # host's two: `balance first` sends every request to the first ready one, a retry to the next, so a
    # request its P/D router fails is retried aggregated, not on another P/D router that lost the same
    # decode. Two front doors (a virtual address): every router listens on its host's address.
    servers = re.findall(r"^\s+server (\S+) (\S+)(?: no-check track \S+)?$", text, re.M)
    here, there = plan["routers"]
    assert here["host"] == plan["frontdoor"]["hosts"][0]
    assert servers == [(r["host"] + suffix, "%s:%d" % (r["address"], port))
                       for r in (here, there) for suffix, port in (("", 8000), ("-aggregated", 8002))]
    assert "balance first" in text and "option redispatch 1" in text
    # Each router's standby (rolling upgrades) is configured out of rotation: only the upgrade brings it in.
    assert re.findall(r"^\s+server (\S+) (\S+) disabled$", text, re.M) == [
        (r["host"] + "-standby", "%s:8001" % r["address"]) for r in plan["routers"]]
    # A P/D router is up while its /readiness says so and the decode answers /health: its server tracks a
    # check-only backend that asks both (the router's own view of a lost decode host took ~2 min).
    decode = plan["routers"][0]["decode_urls"][0].split("//")[1]
    for r in plan["routers"]:
        assert re.search(r"^\s+server %s %s:8000 no-check track be_check_%s/router$" % (r["host"], r["address"], r["host"]),
                         text, re.M)
        check = text.split("backend be_check_%s\n" % r["host"])[1].split("\n\n")[0]
        # The decode is the check server's own address, which a release switch moves (check_decode).
        assert check.splitlines()[1:] == [
            "    http-check connect addr %s port 8000" % r["address"], "    http-check send meth GET uri /readiness",
            "    http-check expect status 200",
            "    http-check connect default", "    http-check send meth GET uri /health", "    http-check expect status 200",
            "    server router %s:8000 addr %s port %s check inter 500ms fastinter 250ms fall 2 rise 2"
            % ((r["address"],) + tuple(decode.split(":")))]
    # The checks ask /readiness (503 once a whole role has no healthy worker), not /liveness (200 with every
    # worker dead).
    assert "default-server check inter 500ms fastinter 250ms fall 2 rise 2" in text
    assert "http-check send meth GET uri /readiness" in text
    assert "/liveness" not in text
    # The front door's own /health: 200 while any router (a backup when no other) can serve, else 503.
    assert re.search(r"return status 200 .* if \{ path /health \} \{ nbsrv\(be_routers\) gt 0 \}", text)
    assert "retry-on conn-failure empty-response junk-response" in text
    assert "req.hdr_val(content-length) gt 2097152" in text
    assert "req.hdrs,length gt 16384" in text
    # Issue 40: the buffer holds the largest allowed request whole, so a request a router failed before
    # streaming can be replayed however large its prompt; HAProxy's timeouts are inactivity bounds, the
    # old worker after a reload keeps its streams as long as the routers' total deadline.
    assert re.search(r"^\s+tune.bufsize %d$" % (2097152 + 16384 + 1024), text, re.M)
    assert "timeout http-request 10s" in text and "timeout server 1800s" in text
    assert re.search(r"^\s+hard-stop-after 43144s$", text, re.M)
    # The key never travels past the front door nor into the log; the routers get the deployment's key
    # from HAProxy's environment.
    assert "http-request del-header authorization" in text
    assert 'set-header Authorization "Bearer ${PDCTL_UPSTREAM_API_KEY}"' in text
    log_format = next(line for line in text.splitlines() if "log-format" in line)
    assert "client=%[var(txn.client)]" in log_format
    # No request header, captured header or full request line (which carries the query string).
    assert not re.search(r"hdr\(|%hrl?\b|%r\b|%\{\+Q\}r", log_format)


@pytest.mark.parametrize("inv", ["lab", "b300"])
def test_rendered_config_passes_haproxy_check(rendered, inv, tmp_path):
    haproxy = requires.binary("haproxy", "the front door's configuration is checked by HAProxy itself")
    _, text = _cfg(rendered, inv)
    self_signed(tmp_path / "frontdoor.pem")
    (tmp_path / "clients.map").write_text("")
    text = text.replace("/etc/haproxy/pdctl/", "%s/" % tmp_path)
    (tmp_path / "haproxy.cfg").write_text(text)
    res = subprocess.run([haproxy, "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[ALERT]" not in res.stderr and "[WARNING]" not in res.stderr, res.stderr


def test_two_front_door_hosts_behind_a_virtual_address_each_admit_the_limit(tmp_path):
    """Only the host holding the virtual address takes clients, so each admits N (not half of it); the
    keepalived configuration names this host's address, its peer and the address."""
    out = tmp_path / "out"
    assert cli.main(["render", "-i", str(ROOT / "inventories/lab"), "--out", str(out)]) == 0
    for host, own, other, peer, priority in (
            ("lab-decode-0", "10.89.64.13", "lab-prefill-0", "10.89.64.11", 150),
            ("lab-prefill-0", "10.89.64.11", "lab-decode-0", "10.89.64.13", 140)):
        text = (out / host / "etc/haproxy/haproxy.cfg").read_text()
        assert "maxconn 16 maxqueue 32" in text
        # Its own routers first (P/D, then aggregated), then its peer's.
        assert re.findall(r"^\s+server (\S+) (\S+)(?: no-check track \S+)?$", text, re.M) == [
            (host, own + ":8000"), (host + "-aggregated", own + ":8002"),
            (other, peer + ":8000"), (other + "-aggregated", peer + ":8002")]
        assert re.findall(r"^\s+server (\S+) (\S+) disabled$", text, re.M) == [
            (host + "-standby", own + ":8001"), (other + "-standby", peer + ":8001")]
        vrrp = (out / host / "etc/keepalived/keepalived.conf").read_text()
        assert re.search(r"^\s+unicast_src_ip %s$" % own, vrrp, re.M)
        assert re.search(r"^\s+unicast_peer \{\n\s+%s\n\s+\}" % peer, vrrp, re.M)
        assert re.search(r"^\s+priority %d$" % priority, vrrp, re.M)
        assert re.search(r"^\s+virtual_router_id 39$", vrrp, re.M) and "state BACKUP" in vrrp and "nopreempt" in vrrp
        assert "10.89.64.200/32 dev eth0" in vrrp
        assert 'script "/usr/bin/systemctl is-active --quiet haproxy"' in vrrp
        keepalived = shutil.which("keepalived") or "/usr/sbin/keepalived"
        if Path(keepalived).exists():
            res = subprocess.run([keepalived, "--config-test", "--use-file", str(out / host / "etc/keepalived/keepalived.conf")],
                                 capture_output=True, text=True)
            assert res.returncode == 0, res.stdout + res.stderr
    assert not (out / "lab-prefill-1/etc/keepalived").exists()


def test_clients_map_holds_hashes_of_clients_not_revoked(tmp_path):
    clients = [{"name": "alpha", "key": "alpha-key-0123456789"}, {"name": "beta", "key": "beta-key-0123456789"},
               {"name": "gone", "key": "gone-key-0123456789"}]
    playbook = tmp_path / "map.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "vars_files": [str(ROLE / "vars/main.yml")],
        "tasks": [{"ansible.builtin.template": {"src": str(ROLE / "templates/clients.map.j2"),
                                                "dest": str(tmp_path / "clients.map"), "mode": "0600"}}]}]))
    extra = {"frontdoor_clients": clients, "frontdoor_revoked": ["gone"], "frontdoor_config_dir": "/etc/haproxy",
             "frontdoor_plan": {"hosts": ["h"]}, "frontdoor_max_inflight": 1, "frontdoor_max_queue": 1,
             "ansible_python_interpreter": sys.executable}
    (tmp_path / "extra.yml").write_text(yaml.safe_dump(extra))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    res = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                          "-c", "local", str(playbook), "-e", "@%s" % (tmp_path / "extra.yml")],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    text = (tmp_path / "clients.map").read_text()
    entries = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    assert entries == [[hashlib.sha256(c["key"].encode()).hexdigest(), c["name"]] for c in clients[:2]]
    assert not any(c["key"] in text for c in clients)


def test_os_vars_declare_haproxy_for_the_store():
    for os_name in ("Debian", "Ubuntu"):
        data = yaml.safe_load((ROLE / "vars" / ("%s.yml" % os_name)).read_text())
        assert data["frontdoor_packages"] == ["haproxy"]
    assert "haproxy" in store.declared_debian_packages()


def test_bootstrap_installs_haproxy_for_the_check():
    line = next(l for l in (ROOT / "scripts/bootstrap").read_text().splitlines() if l.startswith("APT_PACKAGES="))
    assert "haproxy" in line.split("(", 1)[1].rstrip(")").split()


def test_keepalived_comes_from_the_store_at_the_manifest_release():
    vip_role = ROOT / "roles/frontdoor_vip"
    assert yaml.safe_load((vip_role / "vars/Debian.yml").read_text())["frontdoor_vip_packages"] == ["keepalived"]
    assert "keepalived" in store.declared_debian_packages()
    ubuntu = yaml.safe_load((vip_role / "vars/Ubuntu.yml").read_text())["frontdoor_vip_packages"]
    assert ubuntu == ["keepalived=1:{{ pdctl_versions.keepalived }}*"]
    versions = yaml.safe_load((ROOT / "inventories/b300/group_vars/all/versions.yml").read_text())["pdctl_versions"]
    assert versions["keepalived"] == "2.2.8"
