# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible's linear strategy, run over Mitogen when it is installed (the controller pin in pyproject.toml).

Mitogen keeps one Python interpreter per host for the whole run instead of one SSH exec, sudo and
interpreter start per task: a converged site.yml re-run on the lab takes about half the time, with the
same tasks, order and results. Without Mitogen this is the plain linear strategy (one warning line when
a run starts), so a controller that lacks it still runs every playbook. ansible.cfg selects it;
ANSIBLE_STRATEGY=linear turns it off for one run.
"""

DOCUMENTATION = r"""
name: pdctl_linear
short_description: linear, over Mitogen when it is installed
description:
  - The linear strategy. When the mitogen package is installed, tasks run over Mitogen's persistent
    per-host interpreters (ansible_mitogen's strategy mixin); otherwise Ansible's own linear strategy.
version_added: "0.1.0"
author:
  - pdctl contributors (!UNKNOWN)
"""

from ansible.plugins.loader import strategy_loader
from ansible.utils.display import Display

try:
    # Mitogen checks the Ansible release and sets up its loaders on this import, before its strategy.
    import ansible_mitogen.loaders
    import ansible_mitogen.affinity
    import ansible_mitogen.strategy
except ImportError:
    _MIXINS = ()
else:
    _MIXINS = (ansible_mitogen.strategy.StrategyMixin,)
    # Mitogen pins its processes to CPUs. With fewer than 4 CPUs it pins the top-level process and
    # every worker (and their children) to one CPU and reserves the other for its multiplexer: on a
    # 2-core controller a converged site.yml re-run took 103 s pinned and 68 s unpinned. Leave the
    # placement to the kernel's scheduler: Policy is Mitogen's no-op base policy.
    ansible_mitogen.affinity.policy = ansible_mitogen.affinity.Policy()

_Linear = strategy_loader.get("linear", class_only=True)


class StrategyModule(*_MIXINS, _Linear):
    def __init__(self, *args, **kwargs):
        if not _MIXINS:
            Display().warning("mitogen is not installed: running the plain linear strategy (slower, same results)")
        super().__init__(*args, **kwargs)
