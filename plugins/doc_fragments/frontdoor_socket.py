# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The runtime API socket of the front door (HAProxy), for the modules that drive it."""
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  socket:
    description: HAProxy's runtime API socket (admin level).
    type: path
    default: /run/haproxy/admin.sock
"""
