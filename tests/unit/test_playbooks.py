"""Playbook-level checks that need no hosts."""
import re
import subprocess
import sys
from pathlib import Path

import yaml

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
            # Ansible reads defaults/main/*.yml as well (the defaults layer: its versions file is one of them).
            assert (role / part).is_file() or part == "defaults/main.yml" and any((role / "defaults/main").glob(
                "*.yml")), "%s lacks %s" % (role.name, part)



def _seed_host_token(hub_endpoint, store_url):
    """The token site.yml hands the model_weights role, templated as Ansible does."""
    import yaml
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    plays = yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())
    role = next(r for play in plays for r in play.get("roles", [])
                if isinstance(r, dict) and r.get("role") == "pdctl.vllm_pd.model_weights")
    templar = Templar(loader=DataLoader(), variables={
        "pdctl_model_hub_endpoint": hub_endpoint, "pdctl_artifact_store_url": store_url, "pdctl_hf_token": "hf_SECRET"})
    return templar.template(trust_as_template(role["vars"]["model_weights_hub_token"])).strip()


def test_the_seed_host_sends_no_token_to_the_stores_hub_mirror():
    # The mirror is plain HTTP and needs no token (inventories/b300); a Hub of its own (the lab's stub,
    # or a site's own Hub over HTTPS) gets it.
    assert _seed_host_token("http://store.example:8780/hub", "http://store.example:8780/") == ""
    assert _seed_host_token("http://10.89.64.1:8781", "http://10.89.64.1:8780") == "hf_SECRET"


# Imported only: upgrade.yml runs preflight before importing it.
IMPORTED_ONLY = {"upgrade_pass.yml"}
PLAN_STEP = re.compile(r"role: pdctl\.vllm_pd\.preflight\b|name: pdctl\.vllm_pd\.preflight\s+tasks_from: 0020-plan\.yml")


def _plays(path):
    """The plays of a playbook in the order they run, imported playbooks expanded: (file, play)."""
    for play in yaml.safe_load(path.read_text()):
        imported = play.get("ansible.builtin.import_playbook")
        if imported:
            yield from _plays(path.parent / imported)
        else:
            yield path.name, play


def test_every_playbook_that_reads_the_plan_computes_it_first():
    """A play that reads preflight_plan runs after a play that computes it, or computes it itself (preflight's
    0020-plan.yml when it is not defined). playbooks/gates.yml on its own read it undefined and failed as soon
    as the gates had to measure (a forced run, or any change since the last accepted verdict)."""
    problems = []
    for path in sorted((ROOT / "playbooks").glob("*.yml")):
        if path.name in IMPORTED_ONLY:
            continue
        computed = False
        for name, play in _plays(path):
            text = yaml.safe_dump(play, width=1000)
            computes = bool(PLAN_STEP.search(text))
            if "preflight_plan" in text and not computed and not computes:
                problems.append("%s: play %r (%s) reads preflight_plan before any play computes it"
                                % (path.name, play.get("name"), name))
            computed = computed or computes
    assert not problems, "\n".join(problems)
