"""House rules for plugins/modules that ansible-test does not check.

`ansible-test sanity` (scripts/ansible-test) checks the rest: validate-modules (DOCUMENTATION against the
argument spec, RETURN, EXAMPLES, markup, licence header), ansible-doc (every module renders).
"""
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
def test_every_module_supports_check_mode_and_says_so(name, monkeypatch):
    doc = yaml.safe_load(load(name).DOCUMENTATION)
    assert {"check_mode", "diff_mode"} <= set(doc["attributes"])
    assert doc["attributes"]["check_mode"]["support"] == "full"
    assert captured_module_kwargs(name, monkeypatch)["supports_check_mode"] is True


@pytest.mark.parametrize("name,option", [("accuracy_gate", "hf_token"), ("accuracy_gate", "api_key"),
                                         ("sla_gate", "api_key"), ("model_sync", "token")])
def test_secrets_are_no_log(name, option, monkeypatch):
    # validate-modules only asks that secret-looking options set no_log at all; False would pass it.
    assert captured_module_kwargs(name, monkeypatch)["argument_spec"][option].get("no_log") is True
