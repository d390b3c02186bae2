"""Every module in plugins/modules: its documentation parses, matches its argument spec, and renders.

ansible-test's validate-modules does not apply to a playbook repository, so this does its core job.
"""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.module_utils import basic
from module_harness import load

from inventories import ROOT

MODULES = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py"))


def captured_module_kwargs(name, monkeypatch):
    captured = {}
    monkeypatch.setattr(basic.AnsibleModule, "__init__", lambda self, **kw: captured.update(kw))
    load(name).build_module()
    return captured


@pytest.mark.parametrize("name", MODULES)
def test_documentation_matches_the_argument_spec(name, monkeypatch):
    mod = load(name)
    doc = yaml.safe_load(mod.DOCUMENTATION)
    assert doc["module"] == name
    assert {"check_mode", "diff_mode"} <= set(doc["attributes"])
    assert isinstance(yaml.safe_load(mod.EXAMPLES), list)
    for key, ret in yaml.safe_load(mod.RETURN).items():
        assert {"description", "type", "returned"} <= set(ret), "%s RETURN %s" % (name, key)
    kwargs = captured_module_kwargs(name, monkeypatch)
    assert kwargs["supports_check_mode"] is True
    spec = kwargs["argument_spec"]
    assert set(doc["options"]) == set(spec)
    for option, meta in doc["options"].items():
        where = "%s.%s" % (name, option)
        assert meta.get("type", "str") == spec[option].get("type", "str"), where
        assert meta.get("required", False) == spec[option].get("required", False), where
        assert meta.get("default") == spec[option].get("default"), where
        assert meta.get("choices") == spec[option].get("choices"), where


def test_secrets_are_no_log():
    for name, option in (("accuracy_gate", "hf_token"), ("accuracy_gate", "api_key"), ("sla_gate", "api_key"),
                         ("model_sync", "token")):
        assert "no_log=True" in (ROOT / "plugins" / "modules" / (name + ".py")).read_text().split(option + "=dict(")[1].split(")")[0]


@pytest.mark.parametrize("name", MODULES)
def test_ansible_doc_renders(name):
    res = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "pdctl.vllm_pd." + name],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert name in res.stdout and "OPTIONS" in res.stdout
