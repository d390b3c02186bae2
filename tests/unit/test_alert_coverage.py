"""Every metric every alert rule reads is produced by some job of the PRODUCTION scrape configuration
(`pdctl render -i inventories/b300`: its prometheus.yml, its rules file and its DCGM counters file), and
the check fails when a job is taken out. Names from real sources: tests/alert_coverage.py."""
from __future__ import annotations

import pytest
import yaml

import alert_coverage
from pdctl import cli, collection, inventory

ROOT = collection.root()


@pytest.fixture(scope="module")
def production(tmp_path_factory):
    out = tmp_path_factory.mktemp("render")
    assert cli.main(["render", "-i", str(ROOT / "inventories/b300"), "--out", str(out)]) == 0
    (prometheus,) = out.glob("*/etc/prometheus/prometheus.yml")
    host = prometheus.parents[2]
    counters = sorted(out.glob("*/etc/dcgm-exporter/pdctl-counters.csv"))
    collectors = sorted(out.glob("*/etc/systemd/system/pdctl-unit-memory.service"))
    config = yaml.safe_load(prometheus.read_text())
    # The serving hosts, however many production has (a fourth prefill host is one line in hosts.yml).
    serving = sorted({i["host"] for i in inventory.plan(ROOT / "inventories/b300")["instances"]})
    rules = [r for g in yaml.safe_load((host / "etc/prometheus/rules/pdctl-rules.yml").read_text())["groups"]
             for r in g["rules"]]
    return {"config": config, "rules": rules, "counters": counters, "host": host.name, "serving": serving, "collectors": collectors}


def _produced(config, counters_text, unit_memory=True):
    sources = alert_coverage.job_sources(counters_text, unit_memory)
    jobs = [j["job_name"] for j in config["scrape_configs"]]
    unknown = set(jobs) - set(sources)
    assert not unknown, "scrape jobs without a known metric source (add one to tests/alert_coverage.py): %s" % unknown
    return {job: sources[job] for job in jobs}


def test_every_metric_every_rule_reads_is_scraped_in_production(production):
    assert [p.parents[2].name for p in production["counters"]] == production["serving"]
    texts = {p.read_text() for p in production["counters"]}
    assert len(texts) == 1, "every serving host runs the same counters file"
    # The unit memory collector (node exporter's textfile collector) runs on every serving host too.
    assert [p.parents[3].name for p in production["collectors"]] == production["serving"]
    produced = _produced(production["config"], texts.pop())
    assert alert_coverage.uncovered(production["rules"], produced) == {}
    assert set(produced) == {"vllm", "vllm_router", "node", "haproxy", "dcgm"}


@pytest.mark.parametrize("job", ["vllm", "node", "haproxy", "dcgm"])
def test_removing_a_job_leaves_the_alerts_that_read_it_uncovered(production, job):
    config = dict(production["config"])
    config["scrape_configs"] = [j for j in config["scrape_configs"] if j["job_name"] != job]
    missing = alert_coverage.uncovered(production["rules"], _produced(config, production["counters"][0].read_text()))
    assert missing, "removing job %s left every rule covered" % job
    assert all("no such job" in p or "produced by none" in p for problems in missing.values() for p in problems)


def test_the_dcgm_alerts_need_our_counters_file_not_dcgm_exporters_default(production):
    # dcgm-exporter's default list comments out the ECC double-bit and NVLink error counters (shared/facts.md).
    default = ("DCGM_FI_DEV_XID_ERRORS, gauge, x\n# DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, x\n"
               "# DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, counter, x\n")
    produced = _produced(production["config"], default)
    missing = alert_coverage.uncovered(production["rules"], produced)
    assert {"PdctlGpuEccDoubleBit", "PdctlGpuNvlinkErrors"} <= set(missing)


def test_the_memory_alerts_need_the_unit_memory_collector(production):
    # vLLM's process_resident_memory_bytes is its API server's only, and with the recipe's -dp 4 / -dp 8 vLLM
    # exports no process_* series at all (issue 54): the leak and restart alerts read the units' memory and start
    # time, which only the collector writes (for the node job).
    produced = _produced(production["config"], production["counters"][0].read_text(), unit_memory=False)
    missing = alert_coverage.uncovered(production["rules"], produced)
    assert {"PdctlRSSGrowing", "PdctlRSSWillExhaustHostMemory", "PdctlInstanceRestarting"} <= set(missing)
    assert {"pdctl_unit_memory_anon_bytes", "pdctl_unit_start_time_seconds"} <= alert_coverage.unit_memory_names()
    assert not any(name.startswith("process_") for name in alert_coverage.vllm_names())


def test_the_instance_down_alert_covers_every_scrape_job(production):
    (rule,) = [r for r in production["rules"] if r.get("alert") == "PdctlInstanceDown"]
    jobs = [j["job_name"] for j in production["config"]["scrape_configs"]]
    reads = alert_coverage.selectors(rule["expr"])
    assert [m for m, _ in reads] == ["up"]
    covered = set().union(*(alert_coverage._jobs_matching(matcher, jobs) for _, matcher in reads))
    assert covered == set(jobs)


def test_selectors_read_names_and_job_matchers():
    expr = ('sum by (pool) (rate(vllm:x_sum{job="vllm",pool=~"a|b"}[5m])) / on (host) '
            'max by (host) (node_memory_MemTotal_bytes{job=~"no.e"}) and up == 0 unless foo{le="1"}')
    assert alert_coverage.selectors(expr) == [("vllm:x_sum", ("=", "vllm")), ("node_memory_MemTotal_bytes", ("=~", "no.e")),
                                             ("up", None), ("foo", None)]
