"""House rules for plugins/modules that ansible-test does not check.

`ansible-test sanity` (scripts/ansible-test) checks the rest: validate-modules (DOCUMENTATION against the
argument spec, RETURN, EXAMPLES, markup, licence header), ansible-doc (every module renders).
"""
import importlib

import pytest
import yaml
from ansible.module_utils import basic
from ansible.plugins.loader import fragment_loader
from ansible.utils.plugin_docs import add_fragments
from module_harness import load

from inventories import ROOT

MODULES = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py"))


def documentation(name):
    """The module's DOCUMENTATION with its fragments merged in, as ansible-doc shows it."""
    doc = yaml.safe_load(load(name).DOCUMENTATION)
    add_fragments(doc, str(ROOT / "plugins" / "modules" / (name + ".py")), fragment_loader=fragment_loader, is_module=True)
    return doc


def captured_module_kwargs(name, monkeypatch):
    if (ROOT / "plugins" / "action" / (name + ".py")).exists():
        # An action-only module (the file holds its documentation): the spec and check mode are the action plugin's.
        action = importlib.import_module("ansible_collections.pdctl.vllm_pd.plugins.action." + name)
        return {"argument_spec": action.ARGUMENT_SPEC, "supports_check_mode": action.ActionModule._supports_check_mode}
    captured = {}
    monkeypatch.setattr(basic.AnsibleModule, "__init__", lambda self, **kw: captured.update(kw))
    load(name).build_module()
    return captured


@pytest.mark.parametrize("name", MODULES)
def test_every_module_supports_check_mode_and_says_so(name, monkeypatch):
    doc = documentation(name)
    assert {"check_mode", "diff_mode"} <= set(doc["attributes"])
    assert doc["attributes"]["check_mode"]["support"] == "full"
    assert captured_module_kwargs(name, monkeypatch)["supports_check_mode"] is True


@pytest.mark.parametrize("name,option", [("accuracy_gate", "hf_token"), ("accuracy_gate", "api_key"),
                                         ("sla_gate", "api_key"), ("model_sync", "token"), ("instance_canary", "api_key")])
def test_secrets_are_no_log(name, option, monkeypatch):
    # validate-modules only asks that secret-looking options set no_log at all; False would pass it.
    assert captured_module_kwargs(name, monkeypatch)["argument_spec"][option].get("no_log") is True


@pytest.mark.parametrize("name", MODULES)
def test_documented_options_are_the_argument_spec(name, monkeypatch):
    # With the shared blocks in plugins/doc_fragments, a fragment that stops matching a module shows here
    # (ansible-test's validate-modules checks the same on the built collection).
    assert set(documentation(name)["options"]) == set(captured_module_kwargs(name, monkeypatch)["argument_spec"])
