"""The collection as a user gets it: built, installed into an empty path, documented, and its
metadata consistent with what preflight enforces."""
import os
import subprocess
import sys
from pathlib import Path

import yaml

from collection_build import LAB_FILES, LAB_ROLE_DIR, tarball_names, tarball_text
from collection_build import collection_tarball, installed_collection  # noqa: F401  (fixtures)
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


# What the tarball must not carry: the pdctl package (pip installs it, the lab's code with it), the tests, the
# benchmarks, the lab (its inventory, its stand-in's docs, its emulated-hardware role under src/) and what a
# checkout makes (galaxy.yml's build_ignore).
NOT_THE_COLLECTION = ("src", "tests", "benchmarks", "molecule", "scripts", "inventories/lab", "library", ".lab",
                      "artifacts", ".venv", ".ansible", ".git", ".ci", "pyproject.toml") + LAB_FILES


def test_the_tarball_holds_the_collection_only(collection_tarball):
    names = tarball_names(collection_tarball)
    stray = [n for n in names if any(n == top or n.startswith(top + "/") for top in NOT_THE_COLLECTION)
             or "__pycache__" in n or n.endswith((".pyc", ".tar.gz"))]
    assert not stray, "not the collection: %s" % stray[:20]
    # What a user runs is there (the playbooks, every role, the plugins, the sample production inventory).
    for needed in ("MANIFEST.json", "meta/runtime.yml",
                   "playbooks/site.yml", "plugins/modules/sla_gate.py", "plugins/module_utils/topology.py",
                   "inventories/b300/hosts.yml"):
        assert needed in names, needed
    roles = {n.split("/")[1] for n in names if n.startswith("roles/")}
    assert roles == {p.name for p in (ROOT / "roles").iterdir()}
    lab_roles = {p.name for p in LAB_ROLE_DIR.iterdir()}
    assert lab_roles == {"lab_hardware"} and not lab_roles & roles, lab_roles & roles
    for role in lab_roles:  # each says it is the lab's
        meta = yaml.safe_load((LAB_ROLE_DIR / role / "meta/main.yml").read_text())
        assert meta["galaxy_info"]["description"].startswith("Lab only"), role
    for role in roles:
        meta = yaml.safe_load(tarball_text(collection_tarball, "roles/%s/meta/main.yml" % role))
        assert not meta["galaxy_info"]["description"].startswith("Lab only"), role


def test_the_tarballs_config_names_no_lab_inventory(collection_tarball):
    """ansible.cfg ships (pdctl run reads it) with no default inventory: nothing runs against the lab unnamed."""
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read_string(tarball_text(collection_tarball, "ansible.cfg"))
    assert "inventory" not in cfg["defaults"]


def _role_refs(data, found):
    """Role names a play or task list loads: import_role/include_role, a play's roles:, a role's dependencies."""
    if isinstance(data, list):
        for item in data:
            _role_refs(item, found)
    elif isinstance(data, dict):
        for key, value in data.items():
            if key in ("ansible.builtin.import_role", "ansible.builtin.include_role", "import_role",
                       "include_role") and isinstance(value, dict):
                found.append((key.split(".")[-1], value["name"], data.get("when")))
            elif key in ("roles", "dependencies") and isinstance(value, list):
                found.extend(("roles", r["role"] if isinstance(r, dict) else r, None) for r in value)
            else:
                _role_refs(value, found)


def test_every_role_the_tarball_loads_is_in_it_and_none_is_the_labs(collection_tarball):
    names = tarball_names(collection_tarball)
    shipped = {n.split("/")[1] for n in names if n.startswith("roles/")}
    refs = []
    for name in names:
        if name.endswith(".yml") and name.startswith(("playbooks/", "roles/")) or name == "site.yml":
            _role_refs(yaml.safe_load(tarball_text(collection_tarball, name)), refs)
    assert refs
    lab_roles = {p.name for p in LAB_ROLE_DIR.iterdir()}
    for how, role, when in refs:
        short = role.split(".")[-1]
        # The lab's emulated hardware is the bench's to apply (pdctl-lab): no play of the collection loads it.
        assert short not in lab_roles, (how, role, when)
        assert short in shipped, role


def test_the_installed_collection_plans_the_production_inventory(installed_collection):
    """The planner refuses pdctl_* names nothing reads; `pdctl stage` and the lab read some (pdctl_stage_*,
    pdctl_lab_*) and the pdctl package is not in the tarball: where pdctl is installed they are still known
    (plugins/module_utils/varnames.py), so `pdctl plan` accepts production's inventory with only the installed
    collection visible."""
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(installed_collection), **ONLY_INSTALLED)
    code = ("import pdctl, sys; from pdctl import cli, collection; print(collection.root()); "
            "sys.exit(cli.main(['plan', '-i', sys.argv[1]]))")
    res = subprocess.run([sys.executable, "-c", code, str(ROOT / "inventories/b300")], capture_output=True,
                         text=True, env=env, cwd=installed_collection)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith(str(installed_collection)), res.stdout  # the installed copy planned it


def test_the_installed_collection_plans_the_lab_inventory(installed_collection):
    """The lab suite deploys the lab from the installed collection: its plan check knows the lab inventory's
    emulated-hardware variables (pdctl_lab_hw_profile, pdctl_lab_ib_devices) from the pdctl package's lab role,
    though the tarball has no lab role."""
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(installed_collection), **ONLY_INSTALLED)
    code = ("import sys; from pdctl import cli, collection; print(collection.root()); "
            "sys.exit(cli.main(['plan', '-i', sys.argv[1]]))")
    res = subprocess.run([sys.executable, "-c", code, str(ROOT / "inventories/lab")], capture_output=True,
                         text=True, env=env, cwd=installed_collection)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith(str(installed_collection)), res.stdout


def test_only_the_pdctl_package_reads_the_labs_hardware_variables(installed_collection, monkeypatch):
    """Which code knows the lab's emulated-hardware variables: the pdctl package (its lab role), never the
    collection: without the package they are unknown, as any pdctl_* name no code reads."""
    from ansible_collections.pdctl.vllm_pd.plugins.module_utils import varnames

    root = str(installed_collection / "ansible_collections" / "pdctl" / "vllm_pd")
    lab_names = {"pdctl_lab_hw_profile", "pdctl_lab_ib_devices"}
    assert lab_names <= varnames.known_variables.__wrapped__(root)
    monkeypatch.setattr(varnames, "package_dir", lambda: None)
    assert not lab_names & varnames.known_variables.__wrapped__(root)
    assert not lab_names & varnames.known_variables.__wrapped__(str(ROOT))  # this checkout's collection part too


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
