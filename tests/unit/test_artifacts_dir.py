"""Where the controller keeps its run records (gate reports and last accepted verdicts, quarantine, maintenance):
with the inventory by default (a dot directory: Ansible reads every other file under an inventory directory as
inventory), so a site deploying from the installed collection keeps them in its own repository (the collection's
directory may be read-only, and an upgrade replaces it); this repository's two
inventories keep them in its top-level artifacts/, where the tests and the benchmarks read them. `pdctl report` and
`pdctl run` find them where the playbooks write them. Run for real: ansible-playbook with the defaults layer."""
import json
import shutil
from pathlib import Path

import pytest

from inventories import MINIMAL, ROOT, inventory_variant
from layer_play import run_play

from pdctl import cli, inventory, runner

TASKS = """\
    - ansible.builtin.debug:
        var: pdctl_artifacts_dir
      run_once: true
"""
# What a gate run leaves in the records: a JSON report and a binary file.
RECORDS_DIR = """\
    - ansible.builtin.file:
        path: "{{ pdctl_artifacts_dir }}/gates"
        state: directory
        mode: "0755"
      delegate_to: localhost
      run_once: true
"""
RECORD = """\
    - ansible.builtin.copy:
        dest: "{{ pdctl_artifacts_dir }}/gates/%s"
        content: "%s"
        mode: "0644"
      delegate_to: localhost
      run_once: true
"""


def _run(tmp_path, inventory, writes=()) -> dict:
    """{host: pdctl_artifacts_dir} of a run on the inventory (the hosts it read), writing the records given."""
    tasks = TASKS + "".join([RECORDS_DIR] * bool(writes) + [RECORD % w for w in writes])
    out = run_play(tmp_path, inventory, tasks,
                   env={"ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json", "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1"})
    return {h: r["pdctl_artifacts_dir"] for h, r in json.loads(out)["plays"][0]["tasks"][0]["hosts"].items()}


def _artifacts_dir(tmp_path, inventory) -> str:
    (seen,) = _run(tmp_path, inventory).values()
    return seen


def test_a_sites_inventory_keeps_its_run_records_with_it_and_stays_an_inventory(tmp_path):
    """The inventory directory given to -i, as README shows: a run's records inside it must not be read as
    inventory by the next run (with artifacts/ they were: a gate report's bytes became hosts and the next run's
    preflight refused the inventory)."""
    site = tmp_path / "site" / "inventory"
    site.mkdir(parents=True)
    (site / "hosts.ini").write_text("[serving]\nb300-prefill-0 ansible_host=192.0.2.1\n")
    records = str(site / ".artifacts")
    assert _run(tmp_path, site, [("last-accepted.json", '{\\"passed\\": true}'),
                                 ("chart.png", "\\u0089PNG\\r\\n\\u001a\\n")]) == {"b300-prefill-0": records}
    assert (site / ".artifacts" / "gates" / "last-accepted.json").is_file()
    assert _run(tmp_path, site) == {"b300-prefill-0": records}


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
    assert "no gate report under %s yet" % (site / ".artifacts" / "gates") in capsys.readouterr().out
    seen = {}
    monkeypatch.setattr(runner, "run_playbook", lambda playbook, inv, **kw: seen.update(kw) or RESULT)
    assert cli.main(["run", "site.yml", "-i", str(site), "--json", str(tmp_path / "s.json")]) == 0
    assert Path(seen["private_data_dir"]).parent == site / ".artifacts" / "runs"
    # An -e value wins there as in the run.
    assert cli.main(["run", "site.yml", "-i", str(site), "--json", str(tmp_path / "s.json"),
                     "-e", "pdctl_artifacts_dir=%s" % (tmp_path / "elsewhere")]) == 0
    assert Path(seen["private_data_dir"]).parent == tmp_path / "elsewhere" / "runs"


RESULT = runner.PlaybookResult(rc=0, status="successful", stats={}, artifact_dir=Path("/tmp/a"), failures=[],
                               outcomes=[], gates={}, reported={})
