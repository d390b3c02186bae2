"""The lab's emulated hardware is the bench's (issue 36): role lab_hardware lives under src/pdctl/lab/ansible, and
`pdctl-lab` applies it (`up` for the lab's own hosts, `hardware` to put a fault in or the profile back); no
playbook of the collection loads it (tests/unit/test_collection.py, test_role_tasks.py)."""
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from inventories import ROOT
from pdctl.lab import cli, hardware, hosts

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
ROLE = hardware.PLAYBOOK.parent / "roles" / "lab_hardware"


class Calls(list):
    result = None


@pytest.fixture
def calls(monkeypatch):
    """hosts.up/down and hardware.apply recorded instead of run."""
    seen = Calls()
    result = SimpleNamespace(ok=True, artifact_dir="/x", failures=[], recap=lambda: "", total=lambda key: 0)
    monkeypatch.setattr(hosts, "up", lambda inventory=None: seen.append(("up", inventory)) or 0)
    monkeypatch.setattr(hosts, "down", lambda inventory=None: seen.append(("down", inventory)) or 0)
    monkeypatch.setattr(hardware, "apply", lambda inventory, **kw: seen.append(("hardware", inventory, kw)) or result)
    seen.result = result
    return seen


def test_up_writes_the_lab_hosts_emulated_hardware_once_they_answer(calls):
    assert cli.main(["up"]) == 0
    assert calls == [("up", None), ("hardware", hosts.inventory_path(), {"limit": None, "extra_args": []})]


def test_up_of_another_inventory_leaves_the_hardware_to_its_scenario(calls, tmp_path):
    """molecule's host is no serving host: its converge applies role lab_hardware itself."""
    assert cli.main(["up", "-i", str(tmp_path)]) == 0
    assert calls == [("up", tmp_path)]


def test_a_failed_up_writes_no_hardware(calls, monkeypatch):
    monkeypatch.setattr(hosts, "up", lambda inventory=None: calls.append(("up", inventory)) or 1)
    assert cli.main(["up"]) == 1
    assert calls == [("up", None)]


def test_hardware_takes_a_limit_and_extra_vars_and_fails_with_the_run(calls, tmp_path, capsys):
    assert cli.main(["hardware", "-i", str(tmp_path), "--limit", "lab-prefill-1", "-e", "@f.yml", "-e", "a=b"]) == 0
    assert calls == [("hardware", tmp_path, {"limit": "lab-prefill-1", "extra_args": ["-e", "@f.yml", "-e", "a=b"]})]
    calls.result.ok = False
    calls.result.failures = [{"host": "lab-prefill-1", "task": "Profile directory exists", "msg": "denied"}]
    assert cli.main(["hardware"]) == 1
    assert "lab-prefill-1: Profile directory exists: denied" in capsys.readouterr().err


def test_limit_and_extra_vars_go_with_hardware_only(calls, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["up", "--limit", "lab-prefill-1"])
    assert exc.value.code == 2 and calls == []
    assert "go with `hardware` only" in capsys.readouterr().err


def test_the_hardware_playbook_loads_its_role_on_the_serving_hosts():
    (play,) = yaml.safe_load(hardware.PLAYBOOK.read_text())
    assert play["hosts"] == "serving" and play["roles"] == [{"role": "lab_hardware"}]
    res = subprocess.run([ANSIBLE_PLAYBOOK, str(hardware.PLAYBOOK), "-i", "inventories/lab", "--syntax-check"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_lab_role_follows_the_house_layout_and_is_no_role_of_the_collection():
    for part in ("defaults/main.yml", "meta/argument_specs.yml", "meta/main.yml", "tasks/main.yml"):
        assert (ROLE / part).is_file(), part
    assert not (ROOT / "roles" / "lab_hardware").exists()
    meta = yaml.safe_load((ROLE / "meta/main.yml").read_text())
    assert meta["galaxy_info"]["description"].startswith("Lab only")


def test_the_role_scenarios_find_every_role_they_name_through_molecules_roles_path():
    """molecule/<scenario>/converge.yml names roles bare: the collection's under roles/, the lab's under
    src/pdctl/lab/ansible/roles, both on molecule's roles_path (.config/molecule/config.yml). Scenario `installed`
    names the installed collection's roles by FQCN, with no roles_path (tests/unit/test_molecule_installed.py)."""
    cfg = yaml.safe_load((ROOT / ".config" / "molecule" / "config.yml").read_text())
    paths = [Path(p.replace("${MOLECULE_PROJECT_DIRECTORY}", str(ROOT)))
             for p in cfg["ansible"]["cfg"]["defaults"]["roles_path"].split(":")]
    named = set()
    for converge in sorted((ROOT / "molecule").glob("*/converge.yml")):
        if converge.parent.name == "installed":
            continue
        for play in yaml.safe_load(converge.read_text()):
            for role in play.get("roles", []):
                name = role["role"] if isinstance(role, dict) else role
                named.add(name)
                assert any((p / name / "tasks" / "main.yml").is_file() for p in paths), (converge, name, paths)
    assert "lab_hardware" in named and ROLE.parent in paths
