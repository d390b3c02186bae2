"""Playbook-level checks that need no hosts."""
import subprocess
import sys
from pathlib import Path

from inventories import ROOT

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


def test_site_syntax_check_on_b300():
    res = subprocess.run([ANSIBLE_PLAYBOOK, "site.yml", "-i", "inventories/b300", "--syntax-check"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_root_playbooks_only_import():
    for path in ROOT.glob("*.yml"):
        if path.name == "galaxy.yml":  # the collection's metadata, not a playbook
            continue
        text = path.read_text()
        assert "import_playbook" in text and "tasks:" not in text, path


def test_every_role_follows_the_house_layout():
    for role in sorted((ROOT / "roles").iterdir()):
        for part in ("defaults/main.yml", "meta/argument_specs.yml", "tasks/main.yml"):
            assert (role / part).is_file(), "%s lacks %s" % (role.name, part)

