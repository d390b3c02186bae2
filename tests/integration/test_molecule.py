"""Every role scenario under molecule/ passes offline: create, converge, idempotence, verify, destroy."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from inventories import ROOT

SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))


@pytest.mark.lab
@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(scenario):
    """molecule exits non-zero when the second converge changes anything (its idempotence step), so the
    exit code is the verdict; test_every_scenario_checks_idempotence keeps that step in every sequence."""
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"],
               ANSIBLE_FORCE_COLOR="0", PY_COLORS="0", NO_COLOR="1")
    res = subprocess.run(["molecule", "test", "-s", scenario], cwd=ROOT, env=env, capture_output=True, text=True)
    assert res.returncode == 0, "molecule test -s %s failed:\n%s\n%s" % (scenario, res.stdout[-6000:], res.stderr[-3000:])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_checks_idempotence(scenario):
    config = yaml.safe_load((ROOT / "molecule" / scenario / "molecule.yml").read_text())
    assert config["scenario"]["test_sequence"] == ["destroy", "create", "converge", "idempotence", "verify",
                                                   "destroy"]


def test_there_is_a_scenario_for_host_base():
    assert "host_base" in SCENARIOS
