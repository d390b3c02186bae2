"""Session fixtures for tests on the three lab hosts."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import first_converge
from collection_build import INSTALLED_SCENARIO, installed_scenario_args
from collection_build import collection_tarball, installed_collection  # noqa: F401  (fixtures)
from first_converge import LAB_ENV, LAB_INVENTORY
from inventories import ROOT
from pdctl import runner


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test item learns whether its call passed (item.call_passed), for fixtures whose clean-up only
    repairs what a failed test left."""
    report = yield
    if report.when == "call":
        item.call_passed = report.passed
    return report


@pytest.fixture(scope="session")
def lab():
    """The three lab hosts, up (built once; reused if already running)."""
    res = subprocess.run([sys.executable, "-m", "pdctl.lab.cli", "up"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, "pdctl-lab up failed:\n%s\n%s" % (res.stdout, res.stderr)
    os.environ.update(LAB_ENV)
    return LAB_INVENTORY


@pytest.fixture(scope="session")
def converged_lab(lab):
    """site.yml applied once to the lab; the result of that first run (scripts/test runs it beside the
    tests that need no lab and names its saved result in $PDCTL_FIRST_CONVERGE)."""
    saved = os.environ.get("PDCTL_FIRST_CONVERGE")
    result = first_converge.load(Path(saved)) if saved else first_converge.run()
    assert result.ok, "first converge failed:\n%s\n%s" % (result.recap(), result.failures)
    return result


def installed_scenario_run_args():
    """molecule/installed's inventory and extra-vars arguments as `pdctl run` takes them: (inventory, ["-e", ...])."""
    inventory, extra = None, []
    for arg in installed_scenario_args():
        option, _, value = arg.partition("=")
        if option == "--inventory":
            inventory = Path(value)
        else:
            assert option == "--extra-vars", "molecule/installed/molecule.yml: %s is not read here" % arg
            extra += ["-e", value]
    return inventory, extra


class RunOutcome:
    """What `pdctl run` wrote (its JSON summary and JUnit file), read like a PlaybookResult."""

    def __init__(self, rc, json_path, junit_path, stderr, outputs=()):
        self.rc, self.json_path, self.junit_path, self.stderr = rc, json_path, junit_path, stderr
        self.outputs = list(outputs)  # the files its console output went to
        self.doc = json.loads(json_path.read_text())
        self.failures = self.doc["failed_tasks"]
        self.artifact_dir = Path(self.doc["artifact_dir"]) if self.doc.get("artifact_dir") else None

    @property
    def ok(self):
        return self.rc == 0

    def total(self, key):
        field = {"failures": "failed", "dark": "unreachable"}.get(key, key)
        return sum(h[field] for h in self.doc["hosts"].values())

    def recap(self):
        return "\n".join("%-16s %s" % (h, " ".join("%s=%d" % kv for kv in c.items()))
                         for h, c in sorted(self.doc["hosts"].items())) + "\n" + self.stderr[-3000:]


def pdctl_run_start(tmp_path, playbook, inventory, *extra, env=None):
    """`pdctl run` as CI calls it, started; the returned function waits for it and returns a RunOutcome.
    Its output goes to files, not pipes: a full pipe would stop it until the caller reads."""
    json_path, junit_path = tmp_path / "summary.json", tmp_path / "junit.xml"
    stdout, stderr = tmp_path / "pdctl-run.out", tmp_path / "pdctl-run.err"
    with stdout.open("w") as out, stderr.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "pdctl.cli", "run", str(playbook), "-i", str(inventory),
                                 "--json", str(json_path), "--junit", str(junit_path),
                                 "--artifacts", str(tmp_path / "runner"), *extra],
                                cwd=ROOT, env=dict(os.environ, **LAB_ENV, **(env or {})), stdout=out, stderr=err)

    def outcome():
        proc.wait()
        return RunOutcome(proc.returncode, json_path, junit_path, stderr.read_text(), outputs=(stdout, stderr))
    return outcome


def pdctl_run(tmp_path, playbook, inventory, *extra, env=None):
    """`pdctl run` as CI calls it; returns a RunOutcome."""
    return pdctl_run_start(tmp_path, playbook, inventory, *extra, env=env)()


@pytest.fixture(scope="session")
def runs_on_the_converged_lab(converged_lab, lab, installed_collection, tmp_path_factory):
    """The two runs that must find nothing to do on the converged lab, at the same time (each waits on
    its hosts about half its time; one after the other they took 100 s of the lab phase's 20 min):
      - site.yml again, with --diff, from the installed collection through `pdctl run`: the converge of
        molecule/installed (a playbook outside the collection; an inventory of hosts and secrets only, the
        bench's differences as extra vars), its artifacts searched for secrets;
      - site.yml --check --diff.
    Neither may change anything, so neither can disturb the other: a run that changes something fails
    its own test, whichever order they took."""
    work = tmp_path_factory.mktemp("second-run")
    # Only the installed copy is visible: not this checkout's link in the virtualenv.
    env = {"ANSIBLE_COLLECTIONS_PATH": str(installed_collection), "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "false"}
    inventory, extra = installed_scenario_run_args()
    second = pdctl_run_start(work, INSTALLED_SCENARIO / "converge.yml", inventory, "--diff", *extra,
                             "-e", "pdctl_artifacts_dir=%s" % (ROOT / "artifacts"), env=env)
    check = runner.run_playbook("site.yml", lab, check=True, diff=True, envvars=LAB_ENV)
    return second(), check


@pytest.fixture(scope="session")
def second_run(runs_on_the_converged_lab):
    """site.yml again through `pdctl run` (a RunOutcome): must change nothing."""
    return runs_on_the_converged_lab[0]


@pytest.fixture(scope="session")
def check_run(runs_on_the_converged_lab):
    """site.yml --check --diff on the converged lab (a PlaybookResult)."""
    return runs_on_the_converged_lab[1]
