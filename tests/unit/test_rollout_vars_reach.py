"""The rollout filters read each serving host's configuration from hostvars, which holds no role defaults: the
defaults layer's values (the recipe's flags) must be made facts first (playbooks/tasks/upgrade_rollout_pin.yml),
or a prefill change records none and its rollback restores none. Run for real: ansible-playbook on localhost with
the defaults layer, as upgrade.yml's plays have it."""
import json

import yaml

from inventories import ROOT
from layer_play import run_play

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import rollout_state

TASKS = """\
%s
    - ansible.builtin.copy:
        content: "{{ hostvars | pdctl.vllm_pd.rollout_vars(inventory_hostname) | to_json }}"
        dest: "%s"
"""
PIN = """    - ansible.builtin.include_tasks: %s/playbooks/tasks/upgrade_rollout_pin.yml""" % ROOT


def _seen(tmp_path, pin):
    (tmp_path / "hosts.ini").write_text("[serving]\nlocalhost ansible_connection=local\n")
    out = tmp_path / "seen.json"
    run_play(tmp_path, tmp_path / "hosts.ini", TASKS % (PIN if pin else "    - ansible.builtin.meta: noop", out),
             hosts="serving")
    return json.loads(out.read_text())


def test_the_layers_serving_configuration_reaches_the_rollout_filters(tmp_path):
    seen = _seen(tmp_path, pin=True)
    layer = yaml.safe_load((ROOT / "roles/pdctl_defaults/defaults/main/serving.yml").read_text())
    assert set(seen) == set(rollout_state.ROLLOUT_VARS)
    assert seen["pdctl_serve_args"]["prefill"] and seen["pdctl_serve_args"]["decode"]
    assert seen["pdctl_serve_args"]["prefill"] == layer["pdctl_serve_args"]["prefill"]
    assert all(seen[name] is not None for name in rollout_state.ROLLOUT_VARS), seen


def test_without_the_pin_hostvars_reads_the_layers_values_as_none(tmp_path):
    """Why the pin exists (ansible-core: hostvars has no role defaults); if Ansible ever changes this, the pin
    becomes a no-op and this test says so."""
    assert _seen(tmp_path, pin=False)["pdctl_serve_args"] is None
