"""The defaults layer reaches every reader: a value defined only in roles/pdctl_defaults is a role default,
visible only inside a role that depends on it or a play that lists it under `roles:`. An inventory that
sets the value hides a missing link, so these read the files rather than run a play (the lab's converge
failed on `pdctl_artifacts_dir` once it left the inventories)."""
from __future__ import annotations

import re

import pytest
import yaml

from inventories import ROOT, group_var

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import defaults_layer

NAMES = sorted(defaults_layer.names())
LAYER = "pdctl.vllm_pd.pdctl_defaults"


def _reads(text: str) -> list[str]:
    return [n for n in NAMES if re.search(r"\b%s\b" % re.escape(n), text)]


def _plays():
    for path in sorted((ROOT / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(path.read_text()) or []:
            if isinstance(play, dict) and "hosts" in play:
                yield path.name, play


@pytest.mark.parametrize("playbook, play", list(_plays()), ids=lambda v: v if isinstance(v, str) else v.get("name"))
def test_a_play_reading_the_layer_loads_it(playbook, play):
    roles = [r if isinstance(r, str) else r.get("role", r.get("name")) for r in play.get("roles") or []]
    # What the play's own keywords, vars, vars files and tasks read (a role it includes sees the layer through its
    # meta).
    files = "".join((ROOT / "playbooks" / f).read_text() for f in play.get("vars_files") or [])
    read = _reads(yaml.safe_dump({k: v for k, v in play.items() if k != "roles"}) + files)
    assert not read or LAYER in roles, "%s, play %r reads %s: list %s under roles:" % (playbook, play.get("name"), read, LAYER)


ROLES = sorted(p for p in (ROOT / "roles").iterdir() if p.name != "pdctl_defaults")


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_a_role_reading_the_layer_depends_on_it(role):
    text = "".join(f.read_text() for sub in ("tasks", "templates", "defaults", "vars", "handlers")
                   for f in (role / sub).rglob("*") if f.is_file())
    meta = yaml.safe_load((role / "meta" / "main.yml").read_text()) or {}
    deps = [d if isinstance(d, str) else d.get("role", d.get("name")) for d in meta.get("dependencies") or []]
    read = _reads(text)
    assert not read or LAYER in deps, "role %s reads %s: add %s to meta/main.yml dependencies" % (role.name, read, LAYER)


def test_preflight_checks_the_inventory_against_the_layers_spec(tmp_path):
    """The layer's spec is checked once, by preflight (not at every role start): a wrong type stops the run there."""
    from test_role_tasks import run_role_tasks

    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    # Run alone on localhost: no decode group for the SLA gate's ssh prefix, so that value is given.
    alone = {"pdctl_gate_sla": dict(group_var("b300", "pdctl_gate_sla"), exec_prefix=["ssh", "decode-0"])}
    ok, out = run_role_tasks(tmp_path / "good", "preflight", "0022-layer.yml", alone)
    assert ok, out
    ok, out = run_role_tasks(tmp_path / "bad", "preflight", "0022-layer.yml",
                             dict(alone, pdctl_gpu_count="eight"))
    assert not ok and "pdctl_gpu_count" in out, out
