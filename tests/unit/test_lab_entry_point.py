"""The lab is the bench, not the product: its own entry point (`pdctl-lab`, pyproject.toml); the `pdctl` command
has no lab command and no production module imports pdctl.lab."""
import re
import subprocess
import sys
import tomllib

from pdctl import cli, collection

ROOT = collection.root()
IMPORT = re.compile(r"^\s*(from\s+pdctl\.lab\b|from\s+pdctl\s+import\s+.*\blab\b|import\s+pdctl\.lab\b)", re.M)


def test_production_code_does_not_import_the_lab():
    found = []
    for top in ("src/pdctl", "plugins"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel.startswith("src/pdctl/lab/"):
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


def test_pdctl_lab_is_its_own_entry_point_and_pdctl_has_no_lab_command(capsys):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["pdctl-lab"] == "pdctl.lab.cli:main"
    try:
        cli.main(["lab", "up"])
    except SystemExit as exc:
        assert exc.code == 2
    assert "invalid choice: 'lab'" in capsys.readouterr().err
    from pdctl.lab import cli as lab_cli
    try:
        lab_cli.main(["reboot"])
    except SystemExit as exc:
        assert exc.code == 2
    assert "invalid choice: 'reboot'" in capsys.readouterr().err
