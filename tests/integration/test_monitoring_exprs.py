"""Every PromQL expression of the dashboard and the rules parses (promtool) and names only metrics that exist:
vLLM's and the process metrics from the stand-in's live /metrics (a prefill and a decode stand-in on loopback,
the recipe's argv), Prometheus's `up`, our recorded names, the checked lists of the exporters the stand-in
does not replace (tests/promql.py) and what the role's unit memory collector writes. No podman."""
from __future__ import annotations

import subprocess

import pytest
import yaml

import alert_coverage
import promql
import requires
from pdctl.lab import loopback as lb
from pdctl.lab import tokenizer


def _promtool() -> str:
    return requires.binary("promtool", "Prometheus's promtool parses the expressions (apt package prometheus)")


@pytest.fixture(scope="module")
def exposed(tmp_path_factory):
    d = tmp_path_factory.mktemp("monitoring")
    model = tokenizer.build(d / "model")
    profile = d / "profile.yaml"
    profile.write_text("{}\n")
    procs = [lb.start_engine(model, lb.PREFILL_ARGS, profile, d, "prefill"),
             lb.start_engine(model, lb.DECODE_ARGS, profile, d, "decode")]
    try:
        yield set().union(*(promql.exposition_names(p.metrics()) for p in procs))
    finally:
        for p in procs:
            p.stop()


def test_metric_name_extraction():
    expr = ('sum by (pool) (rate(vllm:ttft_sum{job="vllm",pool=~"a|b"}[5m])) / on (x) group_left(y) '
            'histogram_quantile(0.99, foo_bucket) and bar > 1e9 unless deriv(baz[2h] offset 1h)')
    assert promql.metric_names(expr) == {"vllm:ttft_sum", "foo_bucket", "bar", "baz"}


def test_every_dashboard_expression_parses(tmp_path):
    exprs = promql.dashboard_expressions()
    assert len(exprs) >= 20
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": "pdctl:dashboard_expr_%d" % i, "expr": e} for i, (_, e) in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-exprs.yml"
    path.write_text(yaml.safe_dump(rules))
    res = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_rules_and_dashboard_name_only_exposed_metrics(exposed):
    assert "vllm:nixl_xfer_time_seconds_count" in exposed
    # The recipe's -dp 4 / -dp 8 without --api-server-count: vLLM's multiprocess registry, no process_* series.
    assert not any(name.startswith("process_") for name in exposed), sorted(exposed)
    known = exposed | promql.PROMETHEUS | promql.recorded_names() | promql.NODE_EXPORTER | promql.HAPROXY | promql.DCGM
    known |= alert_coverage.unit_memory_names()  # roles/monitoring's collector, through node exporter's textfile
    unknown = {}
    for where, expr in promql.rule_expressions() + promql.dashboard_expressions():
        missing = promql.metric_names(expr) - known
        if missing:
            unknown[where] = sorted(missing)
    assert unknown == {}


def test_the_exporter_lists_do_not_shadow_vllm_names(exposed):
    assert not (promql.NODE_EXPORTER | promql.HAPROXY | promql.DCGM) & exposed
    used = set().union(*(promql.metric_names(e) for _, e in promql.rule_expressions() + promql.dashboard_expressions()))
    assert {n for n in used if n.startswith("vllm:")} <= exposed
