# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How a gate module reaches the service: the front door's URL, its CA and a client key, and where it writes."""
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  router_url:
    description: Base URL the gate sends its requests to (the planner's C(frontdoor.url)), for example C(https://10.0.0.13:443).
    type: str
    required: true
  ca_file:
    description:
      - CA bundle that signed the front door's certificate (the inventory's C(pdctl_frontdoor_ca_file)); default the system's.
    type: path
  api_key:
    description:
      - Bearer token for the router (the P/D router forwards it to the instances, which require it).
      - Never logged.
    type: str
  artifacts_dir:
    description: Report directory.
    type: path
    required: true
"""
