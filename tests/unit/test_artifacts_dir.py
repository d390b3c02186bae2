"""Where the controller keeps its run records (gate reports and last accepted verdicts, quarantine, maintenance):
beside the inventory by default, so a site deploying from the installed collection keeps them in its own
repository (the collection's directory may be read-only, and an upgrade replaces it); this repository's two
inventories keep them in its top-level artifacts/, where `pdctl report`, the tests and the benchmarks read them.
Run for real: ansible-playbook with the defaults layer, as the playbooks have it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inventories import ROOT

PLAY = """\
- hosts: all[0]
  gather_facts: false
  roles: [pdctl.vllm_pd.pdctl_defaults]
  tasks:
    - ansible.builtin.debug:
        var: pdctl_artifacts_dir
"""


def _artifacts_dir(tmp_path, inventory) -> str:
    (tmp_path / "play.yml").write_text(PLAY)
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    res = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
                          str(tmp_path / "play.yml")], cwd=ROOT, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    hosts = json.loads(res.stdout)["plays"][0]["tasks"][0]["hosts"]
    (seen,) = [r["pdctl_artifacts_dir"] for r in hosts.values()]
    return seen


def test_a_sites_inventory_keeps_its_run_records_beside_it(tmp_path):
    site = tmp_path / "site" / "inventory"
    site.mkdir(parents=True)
    (site / "hosts.ini").write_text("[serving]\nb300-prefill-0 ansible_host=192.0.2.1\n")
    assert _artifacts_dir(tmp_path, site / "hosts.ini") == str(site / "artifacts")


@pytest.mark.parametrize("name", ["b300", "lab"])
def test_this_repositorys_inventories_keep_them_in_its_artifacts(tmp_path, name):
    assert _artifacts_dir(tmp_path, ROOT / "inventories" / name) == str(ROOT / "artifacts")
