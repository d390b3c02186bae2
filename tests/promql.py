"""PromQL helpers for the monitoring tests: the expressions of our rules and dashboard, the metric names an
expression selects, and the checked names of the exporters the lab does not run.

The exporters' names come from live captures (HAProxy's built-in exporter, Debian's node exporter, at the
end of this file) and NVIDIA dcgm-exporter's counters; they are kept separate from what the stand-in exposes so
that a typo in a vLLM name cannot hide behind them.
"""
from __future__ import annotations

import json
import re

import yaml

from pdctl import collection

ROOT = collection.root()
RULES = ROOT / "roles/monitoring/files/pdctl-rules.yml"
DASHBOARD = ROOT / "roles/monitoring/files/pdctl-dashboard.json"

DCGM = {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"}
PROMETHEUS = {"up"}  # written by Prometheus itself for every target

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset",
            "bool", "inf", "nan"}


def rule_expressions() -> list[tuple[str, str]]:
    """(rule name, expr) of every recording and alerting rule."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [(r.get("alert") or r["record"], r["expr"]) for g in groups for r in g["rules"]]


def recorded_names() -> set[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["record"] for g in groups for r in g["rules"] if "record" in r}


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title, expr) of every query of the dashboard, rows' nested panels included."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((p["title"], t["expr"]))
            walk(p.get("panels", []))

    walk(json.loads(DASHBOARD.read_text())["panels"])
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (not functions, keywords, labels, durations or strings)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)            # strings (label values)
    s = re.sub(r"\{[^}]*\}", " ", s)                         # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)                        # range and subquery durations
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)  # label lists
    names = set()
    for m in re.finditer(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?", s):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names


def exposition_names(text: str) -> set[str]:
    """Series names in a Prometheus text exposition (with _bucket/_sum/_count/_total as exposed)."""
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


# The exporters' own names as they really expose them: live captures of HAProxy 2.6's built-in exporter and
# Debian's node exporter (tests/fixtures/metrics/README.md says how they were taken). Their process_*/go_*
# series describe the exporter process, not what it exports.
HAPROXY = {n for n in exposition_names((ROOT / "tests/fixtures/metrics/haproxy-2.6.12.prom").read_text())
           if n.startswith("haproxy_")}
NODE_EXPORTER = {n for n in exposition_names((ROOT / "tests/fixtures/metrics/node-exporter-1.5.0.prom").read_text())
                 if n.startswith("node_")}
