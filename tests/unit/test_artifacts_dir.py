"""Where the controller keeps its run records (gate reports and last accepted verdicts, quarantine, maintenance):
beside the inventory by default, so a site deploying from the installed collection keeps them in its own
repository (the collection's directory may be read-only, and an upgrade replaces it); this repository's two
inventories keep them in its top-level artifacts/, where the tests and the benchmarks read them. `pdctl report` and
`pdctl run` find them where the playbooks write them. Run for real: ansible-playbook with the defaults layer."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inventories import MINIMAL, ROOT, inventory_variant

from pdctl import cli, inventory, runner

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


def test_the_production_inventory_keeps_them_in_this_checkouts_artifacts(tmp_path):
    assert _artifacts_dir(tmp_path, ROOT / "inventories" / "b300") == str(ROOT / "artifacts")


@pytest.mark.parametrize("name", ["b300", "lab"])
def test_the_cli_reads_them_where_the_playbooks_write_them(name):
    assert inventory.artifacts_dir(ROOT / "inventories" / name) == ROOT / "artifacts"


def test_a_copy_of_the_lab_inventory_still_means_this_checkouts_records(tmp_path):
    """Tests and benchmarks run the lab from copies of its inventory; what they record must be where the lab's
    readers look (the lab's value is beside the playbooks, not beside the inventory)."""
    assert inventory.artifacts_dir(inventory_variant(tmp_path / "inv")) == ROOT / "artifacts"


def test_pdctl_report_and_run_use_the_inventorys_records(tmp_path, monkeypatch, capsys):
    site = tmp_path / "site"
    shutil.copytree(MINIMAL, site)
    assert cli.main(["report", "-i", str(site)]) == 0
    assert "no gate report under %s yet" % (site / "artifacts" / "gates") in capsys.readouterr().out
    seen = {}
    monkeypatch.setattr(runner, "run_playbook", lambda playbook, inv, **kw: seen.update(kw) or RESULT)
    assert cli.main(["run", "site.yml", "-i", str(site), "--json", str(tmp_path / "s.json")]) == 0
    assert Path(seen["private_data_dir"]).parent == site / "artifacts" / "runs"
    # An -e value wins there as in the run.
    assert cli.main(["run", "site.yml", "-i", str(site), "--json", str(tmp_path / "s.json"),
                     "-e", "pdctl_artifacts_dir=%s" % (tmp_path / "elsewhere")]) == 0
    assert Path(seen["private_data_dir"]).parent == tmp_path / "elsewhere" / "runs"


RESULT = runner.PlaybookResult(rc=0, status="successful", stats={}, artifact_dir=Path("/tmp/a"), failures=[],
                               outcomes=[], gates={}, reported={})
