"""Role task files run offline on the controller (connection local, no host): the checks that must
refuse a bad manifest or inventory before anything is installed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from inventories import ROOT

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
MANIFEST = yaml.safe_load((ROOT / "inventories/b300/group_vars/all/versions.yml").read_text())["pdctl_versions"]


def run_role_tasks(tmp_path, role, tasks_from, extravars, pre_tasks=()):
    """Run roles/<role>/tasks/<tasks_from> on localhost; returns (ok, output)."""
    play = [{
        "name": "offline role tasks",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable},
        "tasks": list(pre_tasks) + [{"name": "tasks under test", "ansible.builtin.include_role":
                                     {"name": role, "tasks_from": tasks_from}}],
    }]
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump(play))
    varfile = tmp_path / "vars.json"
    varfile.write_text(json.dumps(extravars))
    res = subprocess.run([ANSIBLE_PLAYBOOK, str(book), "-i", "localhost,", "-e", "@%s" % varfile],
                         cwd=ROOT, capture_output=True, text=True,
                         env={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": "/usr/bin:/bin",
                              "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "HOME": str(tmp_path)})
    return res.returncode == 0, res.stdout + res.stderr


# ---------------------------------------------------------------- item 1: NVLSM is versioned by date

def test_manifest_pins_nvlsm_by_date_and_fabric_packages_at_the_driver():
    assert MANIFEST["nvidia_fabricmanager"] == MANIFEST["nvidia_driver"]
    assert MANIFEST["libnvidia_nscq"] == MANIFEST["nvidia_driver"]
    assert MANIFEST["nvlsm"] != MANIFEST["nvidia_driver"]
    year, month, day = (int(x) for x in MANIFEST["nvlsm"].split("."))
    assert year >= 2025 and 1 <= month <= 12 and 1 <= day <= 31


def test_versions_check_accepts_the_manifest(tmp_path):
    ok, out = run_role_tasks(tmp_path, "nvidia_fabric", "versions.yml", {"pdctl_versions": MANIFEST})
    assert ok, out


def test_versions_check_refuses_a_driver_versioned_nvlsm(tmp_path):
    ok, out = run_role_tasks(tmp_path, "nvidia_fabric", "versions.yml",
                             {"pdctl_versions": dict(MANIFEST, nvlsm=MANIFEST["nvidia_driver"])})
    assert not ok
    assert "nvlsm %s" % MANIFEST["nvidia_driver"] in out and "versioned by date" in out


def test_versions_check_refuses_nscq_or_fabric_manager_off_the_driver(tmp_path):
    for key in ("libnvidia_nscq", "nvidia_fabricmanager"):
        ok, out = run_role_tasks(tmp_path, "nvidia_fabric", "versions.yml",
                                 {"pdctl_versions": dict(MANIFEST, **{key: "580.82.07"})})
        assert not ok, key
        assert "580.82.07" in out and "must be the same version" in out, out
