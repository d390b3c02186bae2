# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The defaults layer (roles/pdctl_defaults/defaults/main/) for code that reads an inventory outside a play.

A play sees the layer as role defaults (the roles that read it have it as a meta dependency). Two readers do not:
`pdctl plan` (the CLI loads the inventory with Ansible's VariableManager, no play) and the plan filter over
`hostvars` (another host's hostvars hold no role defaults). Both fill in from the role's own file, read here: the
values are written once, in the role.
"""
from __future__ import annotations

import copy
import functools
import os

from ansible.module_utils.common.yaml import yaml_load

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import varnames

# The role's defaults: a directory of files (Ansible reads defaults/main/*.yml in name order, a later one winning).
DEFAULTS_DIR = os.path.join("roles", "pdctl_defaults", "defaults", "main")


def files(root=None):
    """The layer's files in the order Ansible reads them (name order; a later file's value wins)."""
    directory = os.path.join(root or varnames.collection_root(), DEFAULTS_DIR)
    return [os.path.join(directory, name) for name in sorted(os.listdir(directory)) if name.endswith((".yml", ".yaml"))]


@functools.lru_cache(maxsize=4)
def _defaults(root):
    layer = {}
    for path in files(root):
        with open(path, encoding="utf-8") as handle:
            layer.update(yaml_load(handle) or {})
    return layer


def defaults(root=None):
    """{name: value} of the defaults layer (a copy)."""
    return copy.deepcopy(_defaults(root or varnames.collection_root()))


def names(root=None):
    """The names the defaults layer defines (sorted)."""
    return sorted(_defaults(root or varnames.collection_root()))


def layered(variables, names, root=None):
    """`variables` (a mapping) with each of `names` that it lacks and the layer defines filled in from the layer,
    as role defaults would be: the lowest precedence, a whole value (an inventory's dictionary replaces the
    layer's). Returns a new dict."""
    merged = dict(variables)
    layer = _defaults(root or varnames.collection_root())
    for name in names:
        if name not in merged and name in layer:
            merged[name] = copy.deepcopy(layer[name])
    return merged
