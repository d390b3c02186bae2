"""The lab is the bench, not the product: its own entry point (`pdctl-lab`, pyproject.toml), `pdctl lab` an alias
that imports it only when called, and no production module imports pdctl.lab."""
import re
import subprocess
import sys
import tomllib

from pdctl import cli, collection

ROOT = collection.root()
# Where production code may name pdctl.lab, and why (everything else under src/pdctl and plugins/ may not).
ALLOWED = {
    "src/pdctl/cli.py": "the `pdctl lab` alias, imported when called",
    "src/pdctl/report.py": "special-cases the lab inventory (issue 36: to move to the lab's side)",
}
IMPORT = re.compile(r"^\s*(from\s+pdctl\.lab\b|from\s+pdctl\s+import\s+.*\blab\b|import\s+pdctl\.lab\b)", re.M)


def test_production_code_does_not_import_the_lab():
    found = []
    for top in ("src/pdctl", "plugins"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel.startswith("src/pdctl/lab/") or rel in ALLOWED:
                continue
            if IMPORT.search(path.read_text()):
                found.append(rel)
    assert not found, "production modules importing pdctl.lab: %s" % found


def test_the_pdctl_command_loads_no_lab_module_until_the_lab_is_asked_for():
    code = ("import sys\nfrom pdctl import cli, inventory, render, report, run, runner, stage\ncli.build_parser()\n"
            "print(sorted(m for m in sys.modules if m.startswith('pdctl.lab')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_pdctl_lab_is_its_own_entry_point_and_pdctl_lab_its_alias(capsys):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["pdctl-lab"] == "pdctl.lab.cli:main"
    # The alias hands everything after `lab` to pdctl-lab's parser, --help included.
    try:
        cli.main(["lab", "--help"])
    except SystemExit as exc:
        assert exc.code == 0
    assert capsys.readouterr().out.startswith("usage: pdctl lab")
    from pdctl.lab import cli as lab_cli
    try:
        lab_cli.main(["reboot"])
    except SystemExit as exc:
        assert exc.code == 2
    assert "invalid choice: 'reboot'" in capsys.readouterr().err
