"""Ansible's linear strategy, run over Mitogen when it is installed (the controller pin in pyproject.toml).

Mitogen keeps one Python interpreter per host for the whole run instead of one SSH exec, sudo and
interpreter start per task: a converged site.yml re-run on the lab takes about half the time, with the
same tasks, order and results. Without Mitogen this is the plain linear strategy (one warning line), so a
controller that lacks it still runs every playbook. ansible.cfg selects it; `-e`/ANSIBLE_STRATEGY=linear
turns it off for one run.
"""
from __future__ import annotations

from ansible.plugins.loader import strategy_loader
from ansible.utils.display import Display

DOCUMENTATION = """
name: pdctl_linear
short_description: linear, over Mitogen when it is installed
description:
  - The linear strategy. When the mitogen package is installed, tasks run over Mitogen's persistent
    per-host interpreters (ansible_mitogen's strategy mixin); otherwise Ansible's own linear strategy.
author: pdctl
"""

try:
    # Mitogen checks the Ansible release and sets up its loaders on this import, before its strategy.
    import ansible_mitogen.loaders
    import ansible_mitogen.strategy
except ImportError:
    Display().warning("mitogen is not installed: running the plain linear strategy (slower, same results)")
    _Mixins: tuple = ()
else:
    _Mixins = (ansible_mitogen.strategy.StrategyMixin,)

_Linear = strategy_loader.get("linear", class_only=True)


class StrategyModule(*_Mixins, _Linear):
    pass
