"""The pdctl_linear strategy: Mitogen's CPU pinning is off, so workers use every CPU."""
import os
import subprocess
import sys

from inventories import ROOT

# Loads the strategy plugin as ansible-playbook does, then runs Mitogen's own placement calls for
# the top-level process and a worker, and prints the policy and the CPUs this process may run on.
PROBE = """
import os
from ansible.plugins.loader import strategy_loader
strategy_loader.add_directory(%r)
assert strategy_loader.get("pdctl_linear", class_only=True) is not None
import ansible_mitogen.affinity as affinity
affinity.policy.assign_controller()
affinity.policy.assign_worker()
print(type(affinity.policy).__name__, sorted(os.sched_getaffinity(0)))
""" % str(ROOT / "plugins" / "strategy")


def test_workers_are_not_pinned_to_one_cpu():
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    # Policy is Mitogen's no-op base; its LinuxPolicy would pin (to one CPU on a 2-core machine).
    assert res.stdout.split(" ", 1) == ["Policy", "%s\n" % sorted(os.sched_getaffinity(0))]
