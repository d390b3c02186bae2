# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The attributes every pdctl module shares: POSIX hosts, full check mode, no diff.

A module that says more (check mode details, diff support) keeps just that key in its own
C(attributes); Ansible merges the module's keys over these.
"""
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
attributes:
  platform:
    platforms: posix
  check_mode:
    support: full
  diff_mode:
    support: none
author:
  - pdctl contributors (!UNKNOWN)
"""
