"""Where the playbook repository is, and access to its shared module_utils code.

pdctl is used from a checkout of this repository (it drives the playbooks in it), so the
repository root is found from this file, or from PDCTL_REPO when set.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path


def root() -> Path:
    env = os.environ.get("PDCTL_REPO")
    if env:
        return Path(env).resolve()
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "ansible.cfg").is_file() and (parent / "module_utils").is_dir():
            return parent
    raise RuntimeError("cannot find the pdctl repository (ansible.cfg + module_utils); set PDCTL_REPO")


def module_util(name: str):
    """Import module_utils/<name>.py, the code the Ansible modules share with this CLI."""
    path = str(root() / "module_utils")
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module(name)
