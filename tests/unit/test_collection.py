"""The collection as a user gets it: built, installed into an empty path, documented, and its
metadata consistent with what preflight enforces."""
import os
import subprocess
import sys
from pathlib import Path

import yaml

from collection_build import installed_collection  # noqa: F401  (a fixture)
from inventories import ROOT

ONLY_INSTALLED = {"ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "false"}


def test_ansible_doc_renders_a_module_of_the_installed_collection(installed_collection):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(installed_collection), **ONLY_INSTALLED)
    res = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "pdctl.vllm_pd.nvlink_check"],
                         capture_output=True, text=True, env=env, cwd=installed_collection)
    assert res.returncode == 0, res.stderr
    assert str(installed_collection) in res.stdout  # documented from the installed copy, not this checkout
    assert "OPTIONS" in res.stdout and "profile" in res.stdout


def test_installed_roles_and_playbooks_are_listed(installed_collection):
    root = installed_collection / "ansible_collections" / "pdctl" / "vllm_pd"
    assert {p.name for p in (root / "roles").iterdir()} == {p.name for p in (ROOT / "roles").iterdir()}
    assert (root / "playbooks" / "site.yml").is_file() and (root / "meta" / "runtime.yml").is_file()
    assert not (root / ".venv").exists() and not (root / ".lab").exists()


def test_requires_ansible_is_what_preflight_enforces():
    runtime = yaml.safe_load((ROOT / "meta/runtime.yml").read_text())
    defaults = yaml.safe_load((ROOT / "roles/preflight/defaults/main.yml").read_text())
    assert runtime["requires_ansible"] == ">=%s,<%s" % (defaults["preflight_ansible_min"],
                                                        defaults["preflight_ansible_max"])


def test_declared_dependencies_are_the_ones_the_roles_use():
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    used = set()
    for path in list((ROOT / "roles").rglob("*.yml")) + list((ROOT / "playbooks").glob("*.yml")):
        for ns in ("ansible.posix", "community.general", "community.crypto", "containers.podman"):
            if ns + "." in path.read_text():
                used.add(ns)
    assert used <= set(galaxy["dependencies"]), used - set(galaxy["dependencies"])
