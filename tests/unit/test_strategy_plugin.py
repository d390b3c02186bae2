"""The pdctl_linear strategy: Mitogen's CPU pinning is off, so workers use every CPU."""
import os
import subprocess
import sys

import pytest

from inventories import ROOT

pytest.importorskip("ansible_mitogen")

# Loads the strategy plugin as ansible-playbook does, then runs Mitogen's own placement calls for
# the top-level process and a worker, and prints the CPUs this process may run on afterwards.
PROBE = """
import os
from ansible.plugins.loader import strategy_loader
strategy_loader.add_directory(%r)
assert strategy_loader.get("pdctl_linear", class_only=True) is not None
import ansible_mitogen.affinity as affinity
affinity.policy.assign_controller()
affinity.policy.assign_worker()
print(sorted(os.sched_getaffinity(0)))
""" % str(ROOT / "plugins" / "strategy")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs at least 2 CPUs to see pinning")
def test_workers_are_not_pinned_to_one_cpu():
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == str(sorted(os.sched_getaffinity(0)))
