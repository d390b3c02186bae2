"""Alert coverage: every series an alert or recording rule reads is produced by a job of a scrape configuration.

A rule's selectors are read from its expression (metric name and the `job` matcher, if any); the series a
job produces come from real sources (tests/fixtures/metrics/README.md): vLLM's names as the engine stand-in
exposes them (they match vLLM 0.33.0's registration, shared/facts.md), Debian's node exporter and HAProxy 2.6
captured live, what pdctl's unit memory collector writes for node exporter's textfile collector (the role's own
script, run here on a /proc with one instance unit's process), the DCGM fields of the counters file the exporter is run with, and what Prometheus adds to
every target (`up`, `scrape_*`). A selector with a job matcher must be produced by a job it matches; one
without, by any job. Recorded series count as produced when their recording rule is covered.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import promql
from pdctl import collection

ROOT = collection.root()
FIXTURES = ROOT / "tests/fixtures/metrics"
# Prometheus writes these for every target of every job.
PER_TARGET = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
              "scrape_series_added"}
SELECTOR = re.compile(r'(?<![\w.:])([A-Za-z_:][\w:]*)\s*(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})?')
JOB_MATCHER = re.compile(r'\bjob\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def vllm_names() -> set[str]:
    """vLLM's series as the engine stand-in exposes them in the recipe's configuration (prefill -dp 4, decode -dp 8,
    no --api-server-count: one API server per DP rank, the multiprocess registry, no process_* series; prefill and
    decode features on), lab-only names out."""
    from pdctl.lab.engine.metrics import EngineMetrics

    names = set()
    for dp in (4, 8):
        text = EngineMetrics("m", dp_size=dp, spec_decode=True, kv_connector=True).render()
        names |= {n for n in promql.exposition_names(text) if not n.startswith("pdctl_lab_")}
    return names


def capture_names(name: str) -> set[str]:
    return promql.exposition_names((FIXTURES / name).read_text())


def counters_names(text: str) -> set[str]:
    from pdctl.lab.fakegpu.dcgm_exporter import read_counters

    return {field for field, _, _ in read_counters(text)}


UNIT_MEMORY_SCRIPT = ROOT / "roles/monitoring/files/pdctl-unit-memory"


def unit_memory_names() -> set[str]:
    """The series roles/monitoring's unit memory collector writes into node exporter's textfile directory: the
    script itself, run once on a /proc holding one process of one instance unit."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = Path(tmp) / "proc" / "4242"
        proc.mkdir(parents=True)
        (proc / "cgroup").write_text("0::/system.slice/pdctl-vllm-decode-0.service\n")
        (proc / "status").write_text("Name:\tpython3\nRssAnon:\t    1024 kB\n")
        (proc / "stat").write_text("4242 (python3) S 1 4242 4242 0 -1 0 %s 5000\n" % " ".join(["0"] * 12))
        (proc.parent / "stat").write_text("btime 1800000000\n")
        out = Path(tmp) / "pdctl-units.prom"
        subprocess.run([sys.executable, str(UNIT_MEMORY_SCRIPT), "--out", str(out), "--proc", str(proc.parent)],
                       check=True)
        return promql.exposition_names(out.read_text())


def job_sources(dcgm_counters: str, unit_memory: bool = True) -> dict[str, set[str]]:
    """{job name: the series it produces}, for the jobs roles/monitoring can render. unit_memory: the serving
    hosts run the unit memory collector (its series come with the node job)."""
    return {
        "vllm": vllm_names(),
        # No rule reads the router's own metrics; its job is covered by the instance-down rule (`up`).
        "vllm_router": set(),
        "node": capture_names("node-exporter-1.5.0.prom") | (unit_memory_names() if unit_memory else set()),
        "haproxy": capture_names("haproxy-2.6.12.prom"),
        "dcgm": counters_names(dcgm_counters),
    }


def selectors(expr: str) -> list[tuple[str, tuple[str, str] | None]]:
    """[(metric name, (op, value) of its job matcher or None)] for every series selector of expr."""
    names = promql.metric_names(expr)
    out = []
    for m in SELECTOR.finditer(expr):
        if m.group(1) not in names:
            continue
        job = JOB_MATCHER.search(m.group(2) or "")
        out.append((m.group(1), (job.group(1), job.group(2)) if job else None))
    return out


def _jobs_matching(matcher, jobs):
    if matcher is None:
        return list(jobs)
    op, value = matcher
    hit = {"=": lambda j: j == value, "!=": lambda j: j != value,
           "=~": lambda j: re.fullmatch(value, j) is not None, "!~": lambda j: re.fullmatch(value, j) is None}[op]
    return [j for j in jobs if hit(j)]


def uncovered(rules: list[dict], produced: dict[str, set[str]]) -> dict[str, list[str]]:
    """{rule name: ["metric{job...}: why"]} for every rule reading a series no matching job produces.

    rules: the rules file's rules in order (recording rules before what reads them); produced: {job: names}
    of the scrape configuration (Prometheus's per-target series are added here)."""
    produced = {job: set(names) | PER_TARGET for job, names in produced.items()}
    recorded = set()
    missing = {}
    for rule in rules:
        name = rule.get("alert") or rule["record"]
        problems = []
        for metric, matcher in selectors(rule["expr"]):
            if metric in recorded:
                continue
            jobs = _jobs_matching(matcher, produced)
            if not jobs:
                problems.append("%s{job%s\"%s\"}: no such job in the scrape configuration" % (metric, *matcher))
            elif not any(metric in produced[j] for j in jobs):
                problems.append("%s: produced by none of the jobs %s" % (metric, ", ".join(sorted(jobs))))
        if problems:
            missing[name] = problems
        elif "record" in rule:
            recorded.add(rule["record"])
    return missing
