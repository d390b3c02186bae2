"""roles/monitoring: the scrape configuration rendered from the lab and production plans lists every planned
target and passes `promtool check config`; the OS vars declare the packages the lab stages."""
from __future__ import annotations

import subprocess

import jinja2
import yaml

import requires
from pdctl import collection, inventory

ROOT = collection.root()
ROLE = ROOT / "roles/monitoring"


def _render(inv: str, front_door_exporter: str = "10.0.0.5:8405") -> dict:
    plan = inventory.plan(str(ROOT / inv))
    hosts = inventory.load(str(ROOT / inv))
    settings = next(iter(hosts.values()))["vars"]["pdctl_monitoring"]  # the inventory's, else the defaults layer's
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    text = env.from_string((ROLE / "templates/prometheus.yml.j2").read_text()).render(
        monitoring_plan=plan, monitoring_scrape_interval=settings["scrape_interval"],
        _monitoring_rules_file="/etc/prometheus/rules/pdctl-rules.yml",
        monitoring_node_exporter_port=settings["node_exporter_port"],
        monitoring_front_door_exporter=front_door_exporter,
        monitoring_dcgm_exporter_enabled=settings["dcgm_exporter"]["enabled"],
        monitoring_dcgm_exporter_port=settings["dcgm_exporter"]["port"],
        hostvars={h: v["vars"] for h, v in hosts.items()},
        groups={"serving": sorted(h for h in hosts if h in {i["host"] for i in plan["instances"]})})
    return {"text": text, "plan": plan, "config": yaml.safe_load(text)}


def _targets(config: dict, job: str) -> list[str]:
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    return [t for sc in jobs[job]["static_configs"] for t in sc["targets"]] if job in jobs else []


def test_lab_scrape_config_lists_every_planned_target():
    r = _render("inventories/lab")
    plan, config = r["plan"], r["config"]
    assert sorted(_targets(config, "vllm")) == sorted("%s:%d" % (i["address"], i["api_port"]) for i in plan["instances"])
    assert _targets(config, "vllm_router") == ["%s:%d" % (r["address"], r["metrics_port"]) for r in plan["routers"]]
    assert len(_targets(config, "node")) == len(plan["hosts"]) == 3
    assert _targets(config, "haproxy") == ["10.0.0.5:8405"]
    # The lab's DCGM exporter is the stand-in (src/pdctl/lab/fakegpu/dcgm_exporter.py), on every serving host.
    assert sorted(_targets(config, "dcgm")) == ["10.89.64.11:9400", "10.89.64.12:9400", "10.89.64.13:9400"]


def test_haproxy_is_scraped_on_every_planned_front_door_without_an_inventory_override():
    for inv in ("inventories/lab", "inventories/b300"):
        r = _render(inv, front_door_exporter="")
        fd = r["plan"]["frontdoor"]
        assert fd["hosts"] and fd["metrics_port"]
        assert _targets(r["config"], "haproxy") == ["%s:%d" % (a, fd["metrics_port"]) for a in fd["addresses"]], inv


def test_production_scrape_config_has_dcgm_on_every_serving_host():
    r = _render("inventories/b300")
    serving = {i["host"] for i in r["plan"]["instances"]}  # however many hosts production has
    assert sorted(t.rsplit(":", 1)[1] for t in _targets(r["config"], "dcgm")) == ["9400"] * len(serving)
    pools = {sc["labels"]["pool"] for j in r["config"]["scrape_configs"] if j["job_name"] == "vllm"
             for sc in j["static_configs"]}
    assert pools == {"prefill", "decode"}


def test_rendered_config_passes_promtool(tmp_path):
    promtool = requires.binary("promtool", "checks the rendered Prometheus configuration (apt package prometheus)")
    for inv in ("inventories/lab", "inventories/b300"):
        path = tmp_path / "prometheus.yml"
        path.write_text(_render(inv)["text"])
        res = subprocess.run([promtool, "check", "config", "--syntax-only", str(path)], capture_output=True, text=True)
        assert res.returncode == 0, inv + ": " + res.stdout + res.stderr


def test_os_vars_declare_the_packages_the_lab_stages():
    from pdctl.lab import store

    for os_name in ("Debian", "Ubuntu"):
        data = yaml.safe_load((ROLE / "vars" / ("%s.yml" % os_name)).read_text())
        assert data["monitoring_server_packages"] == ["prometheus"]
        assert data["monitoring_node_packages"] == ["prometheus-node-exporter"]
    assert {"prometheus", "prometheus-node-exporter"} <= set(store.declared_debian_packages())
