# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The name a host-check module puts in its messages."""
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  host_label:
    description: Name used in messages (defaults to the host name); pass C(inventory_hostname).
    type: str
"""
