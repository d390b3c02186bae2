"""Session fixtures for tests on the three lab hosts."""
import os
import subprocess
import sys

import pytest

from inventories import ROOT
from pdctl import runner

LAB_INVENTORY = ROOT / "inventories" / "lab"
LAB_ENV = {"PDCTL_LAB_DIR": str(ROOT / ".lab")}


@pytest.fixture(scope="session")
def lab():
    """The three lab hosts, up (built once; reused if already running)."""
    res = subprocess.run([sys.executable, "-m", "pdctl.cli", "lab", "up"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, "pdctl lab up failed:\n%s\n%s" % (res.stdout, res.stderr)
    os.environ.update(LAB_ENV)
    return LAB_INVENTORY


@pytest.fixture(scope="session")
def converged_lab(lab):
    """site.yml applied once to the lab; the result of that first run."""
    result = runner.run_playbook("site.yml", lab, envvars=LAB_ENV)
    assert result.ok, "first converge failed:\n%s\n%s" % (result.recap(), result.failures)
    return result


@pytest.fixture(scope="session")
def second_run(converged_lab, lab):
    """site.yml again, with --diff: must change nothing (and its artifacts are searched for secrets)."""
    return runner.run_playbook("site.yml", lab, diff=True, envvars=LAB_ENV)


@pytest.fixture(scope="session")
def check_run(converged_lab, lab):
    """site.yml --check --diff on the converged lab."""
    return runner.run_playbook("site.yml", lab, check=True, diff=True, envvars=LAB_ENV)
