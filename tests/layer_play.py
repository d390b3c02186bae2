"""Run a play with the defaults layer for real (ansible-playbook), as the collection's plays load it: for the tests
whose point is what a play sees (role defaults are not in hostvars; paths templated from magic variables)."""
import os
import subprocess
import sys
from pathlib import Path

from inventories import ROOT

PLAY = """\
- hosts: %s
  gather_facts: false
  roles: [pdctl.vllm_pd.pdctl_defaults]
  tasks:
%s"""


def run_play(tmp_path: Path, inventory, tasks: str, hosts: str = "all", env=None) -> str:
    """ansible-playbook -i inventory of one play (hosts, the layer, tasks: YAML indented by four); its stdout."""
    (tmp_path / "play.yml").write_text(PLAY % (hosts, tasks))
    res = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
                          str(tmp_path / "play.yml")], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, **(env or {})))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    return res.stdout
