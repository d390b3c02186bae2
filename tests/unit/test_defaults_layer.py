# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The defaults layer (issue 36): roles/pdctl_defaults holds the production recipe's values once; an inventory holds
hosts, secrets and what differs. `pdctl plan` and the plan filter see the layer as a play does."""
from __future__ import annotations

from pathlib import Path

import yaml

from inventories import B300, MINIMAL, PRODUCTION, ROOT
from pdctl import cli, inventory

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import defaults_layer, topology

ROLE = ROOT / "roles" / "pdctl_defaults"


def test_the_minimal_inventory_plans_with_no_problem_as_production_does(capsys):
    assert cli.main(["plan", "-i", str(MINIMAL)]) == 0, capsys.readouterr()
    assert inventory.plan(MINIMAL) == inventory.plan(B300)  # the same three hosts: the same plan


def test_the_minimal_inventory_holds_hosts_secrets_and_the_virtual_address_only():
    files = sorted(str(p.relative_to(MINIMAL)) for p in MINIMAL.rglob("*") if p.is_file())
    assert files == ["group_vars/all/vault.yml", "hosts.yml"]
    assert set(yaml.safe_load((MINIMAL / "hosts.yml").read_text())["all"]["vars"]) == {"pdctl_frontdoor_vip"}


def test_the_layer_is_the_roles_defaults_and_each_has_an_argument_spec():
    layer = {}
    for path in sorted((ROLE / "defaults/main").glob("*.yml")):
        layer.update(yaml.safe_load(path.read_text()))
    assert defaults_layer.defaults() == layer
    spec = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]["layer"]["options"]
    assert set(spec) == set(layer)
    assert set(topology.PLAN_VARS) & set(layer) >= {"pdctl_gpu_count", "pdctl_pools", "pdctl_ports",
                                                     "pdctl_model_path", "pdctl_versions", "pdctl_monitoring"}


def _inventory_values(path):
    """{name: (file, value)} of an inventory's group_vars files that are its own (links into the role are the
    layer's file itself, not a copy)."""
    found = {}
    for file in sorted(Path(path, "group_vars").rglob("*.yml")):
        if (ROLE / "defaults") in file.resolve().parents:
            continue
        for name, value in (yaml.safe_load(file.read_text()) or {}).items():
            found[name] = (str(file.relative_to(path)), value)
    return found


def test_no_inventory_repeats_a_default():
    layer = defaults_layer.defaults()
    for path in (PRODUCTION, ROOT / "inventories/lab"):
        same = [(f, n) for n, (f, v) in _inventory_values(path).items() if n in layer and v == layer[n]]
        assert not same, "%s repeats the defaults layer (roles/pdctl_defaults): %s" % (path, same)


def test_an_inventory_value_replaces_the_layers_whole():
    merged = defaults_layer.layered({"pdctl_ports": {"api_base": 9000}}, ["pdctl_ports", "pdctl_gpu_count"])
    assert merged["pdctl_ports"] == {"api_base": 9000} and merged["pdctl_gpu_count"] == 8
    merged["pdctl_gpu_count"] = 4
    assert defaults_layer.defaults()["pdctl_gpu_count"] == 8  # a copy


def test_a_pool_hosts_instances_fill_its_gpus_unless_the_inventory_lists_them():
    base = {"pdctl_gpu_count": 8, "pdctl_pools": {"prefill": {"tensor_parallel_size": 1, "data_parallel_size": 4}}}
    problems = []
    assert topology.default_instances("h", base, {"prefill", "serving"}, problems) == [{"pool": "prefill"}] * 2
    assert topology.default_instances("h", base, {"router"}, problems) == [] and not problems
    assert topology.default_instances("h", base, {"prefill", "decode"}, problems) == []
    assert problems and "set it" in problems[0]
