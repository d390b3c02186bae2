# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A gate module's settings (the inventory's C(pdctl_gate_*) over the gate's DEFAULTS) and its check mode.

A module that says more about O(config) (the settings it knows) keeps just C(description) in its own
option; Ansible merges the module's keys over these.
"""
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  config:
    description:
      - Settings of the gate's C(DEFAULTS) (plugin_utils C(gates.accuracy), C(gates.sla)), e.g. the inventory's
        C(pdctl_gate_accuracy) or C(pdctl_gate_sla). Options given to the module override them.
    type: dict
    default: {}
attributes:
  check_mode:
    details: Validates the inputs and runs nothing.
"""
