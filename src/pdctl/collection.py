"""Where the collection pdctl.vllm_pd is: the playbooks, roles and lab files pdctl drives.

pdctl imports the collection's shared code as `ansible_collections.pdctl.vllm_pd.plugins.module_utils`
(the same code the modules and filters import), so the collection's directory is simply where Python
found that package: in a checkout, the link scripts/bootstrap makes in the virtualenv; elsewhere, an
installed collection.
"""
from __future__ import annotations

from pathlib import Path

import ansible_collections.pdctl.vllm_pd.plugins.module_utils as _module_utils


def root() -> Path:
    """The collection's top directory (galaxy.yml, playbooks/, roles/, inventories/)."""
    return Path(next(iter(_module_utils.__path__))).resolve().parents[1]
