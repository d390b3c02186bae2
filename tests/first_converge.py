"""site.yml's first run on the lab hosts: the converged_lab fixture's work, also a script.

scripts/test runs it as a script beside the tests that need no lab, as soon as the lab is up
(`python tests/first_converge.py RESULT.json`), and hands the result to the lab phase through
$PDCTL_FIRST_CONVERGE: the lab's hosts would otherwise idle until those tests end, and the lab phase
would start with this run's minutes. Without that variable the fixture runs it itself.
"""
import dataclasses
import json
import os
import sys
from pathlib import Path

from inventories import ROOT
from pdctl import runner

LAB_INVENTORY = ROOT / "inventories" / "lab"
LAB_ENV = {"PDCTL_LAB_DIR": str(ROOT / ".lab")}


def run() -> runner.PlaybookResult:
    try:
        return runner.run_playbook("site.yml", LAB_INVENTORY, envvars=LAB_ENV)
    finally:
        # scripts/test starts ansible-lint and ansible-test once this run, the lab's busiest minutes, is
        # over (PDCTL_CONVERGED_MARK names the file they wait for).
        if os.environ.get("PDCTL_CONVERGED_MARK"):
            Path(os.environ["PDCTL_CONVERGED_MARK"]).touch()


def save(result: runner.PlaybookResult, path: Path) -> None:
    path.write_text(json.dumps(dict(dataclasses.asdict(result), artifact_dir=str(result.artifact_dir))))


def load(path: Path) -> runner.PlaybookResult:
    fields = json.loads(path.read_text())
    return runner.PlaybookResult(**dict(fields, artifact_dir=Path(fields["artifact_dir"])))


def main(out: Path) -> int:
    result = run()
    save(result, out)
    print(result.recap())
    for failure in result.failures:
        print("FAILED %(host)s: %(task)s: %(msg)s" % dict({"msg": ""}, **failure))
    print("first converge %s (artifacts %s)" % ("ok" if result.ok else "FAILED", result.artifact_dir))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
