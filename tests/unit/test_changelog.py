"""The changelog is antsibull-changelog's: one fragment per change under changelogs/fragments, checked by its
own `lint` (a fragment with an unknown section or a malformed body fails), released into changelogs/changelog.yaml
and CHANGELOG.md by `antsibull-changelog release`; nobody edits CHANGELOG.md by hand."""
import subprocess
import sys
from pathlib import Path

from inventories import ROOT

LINT = [str(Path(sys.executable).parent / "antsibull-changelog"), "lint"]


def test_every_fragment_passes_antsibull_changelog_lint():
    fragments = sorted((ROOT / "changelogs/fragments").glob("*.yml"))
    assert fragments
    res = subprocess.run(LINT, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0 and not res.stdout.strip(), res.stdout + res.stderr


def test_lint_rejects_a_fragment_with_an_unknown_section(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("---\nnew_stuff:\n  - a section the configuration does not name\n")
    res = subprocess.run(LINT + [str(bad)], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode != 0 and "invalid section: new_stuff" in res.stdout, res.stdout + res.stderr
