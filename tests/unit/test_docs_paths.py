"""The docs name inventory files that exist, so a newcomer who follows them edits the right file.

The production values live in the defaults layer (roles/pdctl_defaults/defaults/main/<topic>.yml); an
inventory keeps hosts, secrets and what differs. A path such as `inventories/b300/group_vars/all/serving.yml`
left in a doc after its file moved into the layer sends an operator to create a file that overrides the
recipe. Every such path in README.md, docs/*.md and the inventories' comments must exist:
- `inventories/<name>/group_vars/<group>/<file>.yml`: in that inventory (`tests/fixtures/inventories/<name>`
  for a fixture's);
- bare `group_vars/<group>/<file>.yml`: in the inventory whose comment names it, in a doc in inventories/b300
  (the one a newcomer edits: a file only the lab has is no place for a production value);
- `roles/pdctl_defaults/defaults/main/<file>.yml`: in the layer.
A placeholder (`inventories/<site>/...`, `group_vars/all/<topic>.yml`) is not checked. A file that is
made from its `.example` (vault.yml) counts as existing.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from pdctl import collection

ROOT = collection.root()
LAYER = ROOT / "roles" / "pdctl_defaults" / "defaults" / "main"
PRODUCTION = ROOT / "inventories" / "b300"

GROUP_VARS = re.compile(
    r"(?P<fixture>tests/fixtures/)?(?:inventories/(?P<inventory>[^/\s`'\"()]+)/)?"
    r"group_vars/(?P<group>[\w{},<>-]+)/(?P<file>[\w<>.-]+\.yml)")
LAYER_PATH = re.compile(r"roles/pdctl_defaults/defaults/main/(?P<file>[\w<>.-]+\.yml)")


def _documents() -> list[Path]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    docs += sorted(p for p in (ROOT / "inventories").rglob("*") if p.is_file() and p.suffix in (".yml", ".example"))
    return docs


def _groups(group: str) -> list[str]:
    """group_vars/{prefill,decode}/... names two groups."""
    if group.startswith("{") and group.endswith("}"):
        return group[1:-1].split(",")
    return [group]


def _exists(path: Path) -> bool:
    return path.exists() or path.with_name(path.name + ".example").exists()


def missing_paths(text: str, inventory_dir: Path = PRODUCTION) -> list[str]:
    """The inventory and layer file paths `text` names that do not exist (placeholders skipped); a bare
    group_vars path is looked up in inventory_dir."""
    missing = []
    for match in GROUP_VARS.finditer(text):
        inventory, group, name = match["inventory"], match["group"], match["file"]
        if "<" in match[0]:
            continue
        if inventory is None:
            bases = (inventory_dir,)
        elif match["fixture"]:
            bases = (ROOT / "tests" / "fixtures" / "inventories" / inventory,)
        else:
            bases = (ROOT / "inventories" / inventory,)
        for one in _groups(group):
            if not any(_exists(base / "group_vars" / one / name) for base in bases):
                missing.append(match[0] if len(_groups(group)) == 1 else "%s (group %s)" % (match[0], one))
    for match in LAYER_PATH.finditer(text):
        if "<" not in match[0] and not (LAYER / match["file"]).exists():
            missing.append(match[0])
    return missing


def _inventory_of(doc: Path) -> Path:
    """The inventory a file belongs to (inventories/<name>/...), else production's."""
    parts = doc.relative_to(ROOT).parts
    return ROOT / "inventories" / parts[1] if parts[0] == "inventories" else PRODUCTION


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_inventory_files_that_exist(doc):
    problems = ["%s:%d: %s" % (doc.relative_to(ROOT), number, path)
                for number, line in enumerate(doc.read_text().splitlines(), 1)
                for path in missing_paths(line, _inventory_of(doc))]
    assert not problems, (
        "these files do not exist: the value is in the defaults layer (roles/pdctl_defaults/defaults/main/), "
        "or a site overrides it in its inventory's group_vars (say `inventories/<site>/group_vars/all/...`):\n"
        + "\n".join(problems))


def test_the_check_sees_moved_files_and_skips_placeholders():
    # serving.yml moved into the layer: naming it in b300 is an error; the layer's and a placeholder are not.
    assert missing_paths("`inventories/b300/group_vars/all/serving.yml`") == [
        "inventories/b300/group_vars/all/serving.yml"]
    assert missing_paths("(`group_vars/all/host_stack.yml`)") == ["group_vars/all/host_stack.yml"]
    # Only the lab has an engine.yml: a doc's bare path means production's inventory, a lab comment's the lab's.
    assert missing_paths("(`group_vars/all/engine.yml`)") == ["group_vars/all/engine.yml"]
    assert missing_paths("(`group_vars/all/engine.yml`)", ROOT / "inventories" / "lab") == []
    assert missing_paths("group_vars/{prefill,decode}/topology.yml") == [
        "group_vars/{prefill,decode}/topology.yml (group prefill)",
        "group_vars/{prefill,decode}/topology.yml (group decode)"]
    assert missing_paths("roles/pdctl_defaults/defaults/main/nope.yml") == [
        "roles/pdctl_defaults/defaults/main/nope.yml"]
    assert missing_paths(
        "roles/pdctl_defaults/defaults/main/serving.yml, inventories/<site>/group_vars/all/serving.yml, "
        "inventories/b300/group_vars/all/vault.yml, group_vars/all/frontdoor_vip.yml, "
        "inventories/lab/group_vars/all/rollout.yml, group_vars/all/<topic>.yml, "
        "tests/fixtures/inventories/minimal/group_vars/all/vault.yml") == []
