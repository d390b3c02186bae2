"""The role scenarios under molecule/ pass offline, all in one bring-up (scenario `default`):
create one fresh host, converge every role in site.yml's order, idempotence, each role's verify, destroy.

A per-role scenario (`molecule test -s nvidia_driver`) still runs on its own for a developer; the
test command runs `default` because one host instead of six saves minutes of CI on 2 cores.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from inventories import ROOT

MOLECULE = ROOT / "molecule"
# `installed` deploys the whole site from the built collection on the lab's hosts (tests/unit/test_molecule_installed.py).
ROLE_SCENARIOS = sorted(p.parent.name for p in MOLECULE.glob("*/molecule.yml")
                        if p.parent.name not in ("default", "installed"))


def _play(path: Path) -> list:
    return yaml.safe_load(path.read_text())


def test_default_scenario_converges_every_role_of_every_scenario():
    roles_in = {s: [r["role"] for r in _play(MOLECULE / s / "converge.yml")[0]["roles"]] for s in ROLE_SCENARIOS}
    default_roles = [r["role"] for r in _play(MOLECULE / "default" / "converge.yml")[0]["roles"]]
    missing = {s: sorted(set(roles) - set(default_roles)) for s, roles in roles_in.items()}
    assert not any(missing.values()), "roles of these scenarios are not in molecule/default: %s" % missing
    # DOCA-OFED (rdma) before the fabric: NVLSM needs its mlx5_core and ib_umad (issue 13 item 7).
    site_order = ["host_base", "lab_hardware", "nvidia_driver", "rdma", "nvidia_fabric", "cuda_toolkit"]
    assert default_roles == [r for r in site_order if r in default_roles], default_roles


def test_default_scenario_runs_every_scenario_verify():
    imported = [p["ansible.builtin.import_playbook"] for p in _play(MOLECULE / "default" / "verify.yml")]
    assert sorted(imported) == sorted("../%s/verify.yml" % s for s in ROLE_SCENARIOS)


@pytest.mark.lab
@pytest.mark.own_host
@pytest.mark.slow
def test_role_scenarios_in_one_bring_up():
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"],
               ANSIBLE_FORCE_COLOR="0", PY_COLORS="0", NO_COLOR="1")
    res = subprocess.run(["molecule", "test", "-s", "default"], cwd=ROOT, env=env, capture_output=True, text=True)
    # molecule exits non-zero when the second converge changes anything (its idempotence step), so the
    # exit code is the verdict; test_every_scenario_checks_idempotence keeps that step in the sequence.
    assert res.returncode == 0, "molecule test -s default failed:\n%s\n%s" % (res.stdout[-6000:], res.stderr[-3000:])


@pytest.mark.parametrize("scenario", ROLE_SCENARIOS + ["default"])
def test_every_scenario_checks_idempotence(scenario):
    config = yaml.safe_load((MOLECULE / scenario / "molecule.yml").read_text())
    assert config["scenario"]["test_sequence"] == ["destroy", "create", "converge", "idempotence", "verify",
                                                   "destroy"]
