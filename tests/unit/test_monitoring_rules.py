"""The alert rules of roles/monitoring: `promtool check rules`, `promtool test rules`, and the test file covers
every alert both ways (a firing and a non-firing case)."""
from __future__ import annotations

import subprocess

import yaml

import requires
from pdctl import collection

ROOT = collection.root()
RULES = ROOT / "roles/monitoring/files/pdctl-rules.yml"
RULE_TESTS = ROOT / "tests/monitoring/pdctl-rules.test.yml"


def _promtool() -> str:
    return requires.binary("promtool", "Prometheus's promtool checks and unit-tests the alert rules "
                                       "(apt package prometheus, installed by scripts/bootstrap)")


def _alerts() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def test_promtool_check_rules_accepts_the_rules_file():
    res = subprocess.run([_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_promtool_unit_tests_of_the_rules_pass():
    res = subprocess.run([_promtool(), "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]


def test_every_alert_has_a_firing_and_a_non_firing_case():
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing, quiet = set(), set()
    for case in cases:
        for t in case.get("alert_rule_test", []):
            (firing if t.get("exp_alerts") else quiet).add(t["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names, "no alerts in %s" % RULES
    assert names - firing == set(), "alerts without a firing test"
    assert names - quiet == set(), "alerts without a non-firing test"
    assert (firing | quiet) - names == set(), "tests of alerts that do not exist"


def test_slo_limits_in_the_rules_are_the_sla_gates():
    from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import sla

    text = RULES.read_text()
    by_name = {a["alert"]: a["expr"] for a in _alerts()}
    assert "> %g" % (sla.DEFAULTS["max_ttft_ms"] / 1000) in by_name["PdctlMeanTTFTOverSLO"]
    assert "> %.3f" % (sla.DEFAULTS["max_tpot_ms"] / 1000) in by_name["PdctlMeanTPOTOverSLO"]
    assert "pdctl_unit_memory_anon_bytes" in text and "deriv(" in text
    assert "process_resident_memory_bytes" not in by_name["PdctlRSSGrowing"] + by_name["PdctlRSSWillExhaustHostMemory"]
