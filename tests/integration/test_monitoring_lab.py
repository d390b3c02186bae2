"""Monitoring on the lab (issue 18 acceptance 1 and 4): Prometheus on the router host scrapes every planned
target as up, has pdctl's rules loaded, sees decode's KV transfer count rise with traffic, and every metric the
rules and dashboard name exists there (HAProxy's exporter, the DCGM stand-in and vLLM's stand-in included)."""
import time

import httpx
import pytest
import yaml

import promql
from inventories import ROOT
from pdctl import inventory

pytestmark = [pytest.mark.lab, pytest.mark.slow]

PROMETHEUS = "http://10.89.64.13:9090"
FRONTDOOR = "https://10.89.64.13:8443"  # the router behind it listens on loopback
MODEL = "/mnt/model/glm/GLM-5.2-NVFP4"


def _api(path, **params):
    resp = httpx.get(PROMETHEUS + path, params=params, timeout=10)
    resp.raise_for_status()
    return resp.json()["data"]


def _expected_targets():
    plan = inventory.plan(str(ROOT / "inventories/lab"))
    hosts = inventory.load(str(ROOT / "inventories/lab"))
    want = {"http://%s:%d/metrics" % (i["address"], i["api_port"]) for i in plan["instances"]}
    want |= {"http://%s:%d/metrics" % (r["address"], r["metrics_port"]) for r in plan["routers"]}
    want |= {"http://%s:9100/metrics" % hosts[h]["vars"].get("ansible_host", h) for h in plan["hosts"]}
    # The front door's HAProxy exporter, and the DCGM exporter (the lab's stand-in) on every serving host.
    want |= {"http://%s:%d/metrics" % (a, plan["frontdoor"]["metrics_port"]) for a in plan["frontdoor"]["addresses"]}
    want |= {"http://%s:9400/metrics" % i["address"] for i in plan["instances"]}
    return want


def _wait_all_up(want, timeout=90):
    deadline = time.time() + timeout
    while True:
        active = _api("/api/v1/targets")["activeTargets"]
        health = {t["scrapeUrl"]: t["health"] for t in active}
        if set(health) == want and all(h == "up" for h in health.values()) or time.time() > deadline:
            return health
        time.sleep(2)


def _kv_pulls():
    res = _api("/api/v1/query", query='sum(vllm:nixl_xfer_time_seconds_count{job="vllm",pool="decode"})')["result"]
    return float(res[0]["value"][1]) if res else 0.0


def test_prometheus_scrapes_every_planned_target_as_up(converged_lab):
    want = _expected_targets()
    health = _wait_all_up(want)
    assert set(health) == want
    assert {u: h for u, h in health.items() if h != "up"} == {}


def test_pdctl_rules_are_loaded(converged_lab):
    groups = {g["name"]: g for g in _api("/api/v1/rules")["groups"]}
    ours = yaml.safe_load(promql.RULES.read_text())["groups"]
    assert set(groups) == {g["name"] for g in ours}
    for g in ours:
        assert len(groups[g["name"]]["rules"]) == len(g["rules"])


def test_decode_kv_transfer_count_rises_with_traffic(converged_lab):
    key = {c["name"]: c["key"] for c in yaml.safe_load((ROOT / ".lab/secrets/clients.yml").read_text())}["tester"]
    _wait_all_up(_expected_targets())
    before = _kv_pulls()
    for _ in range(3):
        resp = httpx.post(FRONTDOOR + "/v1/chat/completions", timeout=60, headers={"Authorization": "Bearer " + key},
                          verify=str(ROOT / ".lab/tls/ca.pem"),
                          json={"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
        assert resp.status_code == 200, resp.text
    deadline, after = time.time() + 30, before
    while after < before + 3 and time.time() < deadline:
        time.sleep(2)
        after = _kv_pulls()
    assert after >= before + 3


def test_rules_and_dashboard_name_only_metrics_the_live_lab_has(converged_lab):
    _wait_all_up(_expected_targets())
    live = set(_api("/api/v1/label/__name__/values")) | promql.PROMETHEUS | promql.recorded_names()
    unknown = {}
    for where, expr in promql.rule_expressions() + promql.dashboard_expressions():
        missing = promql.metric_names(expr) - live
        if missing:
            unknown[where] = sorted(missing)
    assert unknown == {}


def test_each_instance_units_start_time_is_systemds_and_vllm_exports_no_process_series(converged_lab):
    """Issue 54: the restart and leak alerts read pdctl_unit_start_time_seconds (the unit collector, through node
    exporter), since vLLM with the recipe's -dp 4 / -dp 8 exports no process_* series. Prometheus has one per
    instance, each at systemd's own start of the unit (ExecMainStartTimestamp, to the second); job vllm has no
    process_* series at all."""
    from test_serving import on_host

    plan = inventory.plan(str(ROOT / "inventories/lab"))
    _wait_all_up(_expected_targets())
    deadline, found = time.time() + 60, {}
    while time.time() < deadline and len(found) < len(plan["instances"]):
        found = {r["metric"]["instance_name"]: float(r["value"][1])
                 for r in _api("/api/v1/query", query='pdctl_unit_start_time_seconds{job="node"}')["result"]}
        time.sleep(2)
    assert set(found) == {i["name"] for i in plan["instances"]}, found
    for inst in plan["instances"]:
        usec = on_host(inst["host"], "systemctl", "show", "-p", "ExecMainStartTimestampMonotonic", "--value",
                       inst["unit"]).strip()
        uptime = float(on_host(inst["host"], "cat", "/proc/uptime").split()[0])
        now = float(on_host(inst["host"], "date", "+%s.%N"))
        systemd_start = now - uptime + int(usec) / 1e6
        assert abs(found[inst["name"]] - systemd_start) < 2, (inst["name"], found[inst["name"]], systemd_start)
    process = _api("/api/v1/query", query='count({job="vllm", __name__=~"process_.*"})')["result"]
    assert process == [], process
