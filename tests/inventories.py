"""Build variants of the lab inventory for tests: a real copy plus YAML overrides."""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from pdctl import collection

ROOT = collection.root()
# The production inventory as the unit tests see it: production's group_vars, the recipe's three hosts
# (tests/fixtures/inventories/README.md). PRODUCTION is the real one, for tests whose point it is.
B300 = ROOT / "tests" / "fixtures" / "inventories" / "b300"
PRODUCTION = ROOT / "inventories" / "b300"
# Hosts, secrets and the front doors' address only: everything else from the defaults layer (roles/pdctl_defaults).
MINIMAL = ROOT / "tests" / "fixtures" / "inventories" / "minimal"


def inventory_variant(dest: Path, overrides: dict | None = None, base: str = "lab") -> Path:
    """Copy an inventory (links resolved) to dest and apply overrides: base "lab" is inventories/lab,
    "b300" the tests' production inventory (B300).

    overrides: {"host_vars/<host>": {...}, "group_vars/<group>": {...}, "hosts": <whole hosts.yml>}
    Group overrides land in a file sorted after the originals, so they win like an operator's edit.
    """
    shutil.copytree(B300 if base == "b300" else ROOT / "inventories" / base, dest, symlinks=False)
    if base == "lab":
        # The lab inventory finds the lab's files (keys, profile) beside itself (../../.lab): a copy elsewhere
        # still means this checkout's lab, as connection.yml has it (PDCTL_LAB_DIR first).
        (dest / "group_vars" / "all" / "zz-lab-dir.yml").write_text(
            "pdctl_lab_dir: \"{{ lookup('ansible.builtin.env', 'PDCTL_LAB_DIR') or '%s' }}\"\n" % (ROOT / ".lab"))
    for target, data in (overrides or {}).items():
        if target == "hosts":
            (dest / "hosts.yml").write_text(yaml.safe_dump(data))
            continue
        kind, name = target.split("/", 1)
        if kind == "host_vars":
            path = dest / "host_vars" / ("%s.yml" % name)
        else:
            path = dest / "group_vars" / name / "zz-test-override.yml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data))
    return dest


def _inventory_dir(inventory) -> Path:
    """"b300", "lab", "minimal" or a path."""
    if isinstance(inventory, str) and "/" not in inventory:
        return MINIMAL if inventory == "minimal" else ROOT / "inventories" / inventory
    return Path(inventory)


def defining_file(inventory, name: str) -> Path:
    """The file that gives `name` its value for an inventory's group `all`: the last of its group_vars/all files
    (name order, as Ansible loads them) that sets it, else the defaults layer's file (roles/pdctl_defaults)."""
    group_all = _inventory_dir(inventory) / "group_vars" / "all"
    for path in sorted(group_all.glob("*.yml"), reverse=True):
        if name in (yaml.safe_load(path.read_text()) or {}):
            return path
    layer = ROOT / "roles" / "pdctl_defaults" / "defaults" / "main"
    for path in sorted(layer.glob("*.yml"), reverse=True):
        if name in (yaml.safe_load(path.read_text()) or {}):
            return path
    raise KeyError("%s: neither %s nor the defaults layer sets it" % (name, group_all))


def group_var(inventory, name: str):
    """The untemplated value of `name` for an inventory's group `all` (its own files, else the defaults layer)."""
    return yaml.safe_load(defining_file(inventory, name).read_text())[name]
