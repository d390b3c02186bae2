"""The GPU host stack (issue 3) on the lab: converge from the artifact store, idempotence, truthful
check mode, a manifest version skew refused before any install, and one test per injected fault."""
import pytest
import yaml

from conftest import LAB_ENV
from inventories import ROOT, inventory_variant
from pdctl import runner
from pdctl.lab import hardware

pytestmark = [pytest.mark.lab, pytest.mark.slow]

HOSTS = {"lab-prefill-0", "lab-prefill-1", "lab-decode-0"}
# site.yml's preflight (always), host_base and the host stack; the later plays are other issues'.
SITE_TAGS = "host_base,host_stack"
FAULTY = "lab-prefill-1"


def _manifest():
    path = ROOT / "inventories" / "b300" / "group_vars" / "all" / "versions.yml"
    return yaml.safe_load(path.read_text())["pdctl_versions"]


@pytest.fixture(scope="module")
def host_stack(converged_lab):
    """The lab after site.yml's first run (which includes the host stack)."""
    return converged_lab


def _on_host(host, *argv):
    import subprocess

    return subprocess.run(["podman", "exec", host, *argv], capture_output=True, text=True, check=True).stdout


def test_site_installs_the_host_stack_on_every_host(host_stack):
    manifest = _manifest()
    assert host_stack.ok
    for host in HOSTS:
        held = _on_host(host, "apt-mark", "showhold").split()
        smi = _on_host(host, "nvidia-smi", "--query-gpu=index,driver_version,fabric.state", "--format=csv,noheader")
        rows = [r.split(", ") for r in smi.strip().splitlines()]
        assert len(rows) == 8 and {r[1] for r in rows} == {manifest["nvidia_driver"]}, (host, rows)
        assert {r[2] for r in rows} == {"Completed"}, (host, rows)
        assert held, "%s: no package is held against upgrades" % host
        fm = _on_host(host, "dpkg-query", "-W", "-f=${Version}", "nvidia-fabricmanager")
        assert fm.startswith(manifest["nvidia_fabricmanager"]), (host, fm)


def test_second_run_changes_nothing(second_run):
    assert second_run.ok and second_run.total("changed") == 0, second_run.recap()


def test_check_diff_on_converged_lab_reports_nothing(check_run):
    assert check_run.ok and check_run.total("changed") == 0, check_run.recap()


def test_fabric_manager_version_skew_fails_before_any_install(host_stack, tmp_path):
    versions = dict(_manifest(), nvidia_fabricmanager="580.82.07")
    inv = inventory_variant(tmp_path / "inv", {"group_vars/all": {"pdctl_versions": versions}})
    result = runner.run_playbook("site.yml", inv, tags=SITE_TAGS, envvars=LAB_ENV)
    assert not result.ok
    assert result.total("changed") == 0, result.recap()
    assert {f["task"] for f in result.failures} == {"Fabric manager and NSCQ versions equal the driver version"}
    for f in result.failures:
        assert f["host"] in f["msg"]
        assert "580.82.07" in f["msg"] and "580.95.05" in f["msg"]
        assert "Nothing was installed" in f["msg"]


@pytest.fixture(scope="module")
def restore_lab_hardware(lab):
    """After this module's fault tests, the lab's normal hardware profile back (the bench's lab_hardware,
    `pdctl-lab hardware`): once, since lab_hardware writes the whole profile and device tree from the
    inventory, so each fault test's run replaces the last one's fault (as test_faults_lab.restore_engine does
    for engine profiles)."""
    yield
    result = hardware.apply(lab, limit=FAULTY, envvars=LAB_ENV)
    assert result.ok, result.failures


FAULTS = [
    ("missing_gpu", {"pdctl_lab_hw_profile": {"faults": {"missing_gpus": [5]}}},
     "Host sees every GPU at the manifest driver version",
     ["7 GPUs at driver 580.95.05", "expected 8 GPUs", "GPU slot 5 (00000000:BB:00.0) missing"]),
    ("link_down", {"pdctl_lab_hw_profile": {"faults": {"links_down": [{"gpu": 2, "link": 7}]}}},
     "GPUs, NVLinks, fabric and versions match the expected hardware",
     ["GPU 2 link 7: state Inactive, expected Active", "GPU2 <-> GPU3: NV17, expected NV18"]),
    ("fabric_not_completed",
     {"pdctl_lab_hw_profile": {"faults": {"fabric": [{"gpu": 3, "state": "In Progress", "status": "N/A"}]}},
      "nvidia_fabric_wait_timeout": 4, "nvidia_fabric_wait_delay": 2},
     "Every GPU reports fabric state Completed and status Success",
     ["GPU 3 (00000000:70:00.0): fabric state In Progress/status N/A, expected Completed/Success"]),
    ("ecc_errors", {"pdctl_lab_hw_profile": {"faults": {"ecc_errors": [{"gpu": 1, "volatile_uncorrected": 4}]}}},
     "No GPU reports uncorrected ECC errors",
     ["GPU 1 (00000000:3D:00.0): 4 volatile uncorrected ECC errors, expected 0"]),
    ("fabric_manager_skew", {"pdctl_lab_hw_profile": {"faults": {"fabric_manager_version": "580.82.07"}}},
     "GPUs, NVLinks, fabric and versions match the expected hardware",
     ["nvidia-fabricmanager 580.82.07 does not match driver 580.95.05"]),
    ("driver_skew", {"pdctl_lab_hw_profile": {"faults": {"driver_version": "580.82.07"}}},
     "Host sees every GPU at the manifest driver version",
     ["8 GPUs at driver 580.82.07, expected 8 GPUs at driver 580.95.05"]),
    # A KV NIC (ConnectX-8) down; the ConnectX-7 switch management ports are not KV devices.
    ("rdma_port_down", {"pdctl_lab_ib_devices": [
        {"name": "mlx5_%d" % i, "state": "DOWN" if i == 6 else "ACTIVE", "vpd": "SW_MNG" if 2 <= i <= 5 else ""}
        for i in range(12)]},
     "Every RDMA device the inventory names is present and ACTIVE",
     ["device mlx5_6 port 1: state 1: DOWN, expected ACTIVE"]),
]


@pytest.mark.parametrize("case,host_vars,task,words", FAULTS, ids=[f[0] for f in FAULTS])
def test_injected_fault_fails_the_post_check(host_stack, restore_lab_hardware, tmp_path, case, host_vars, task, words):
    inv = inventory_variant(tmp_path / "inv", {"host_vars/" + FAULTY: host_vars})
    # Only the faulty host: the healthy ones converge in the session's runs (three hosts at once cost
    # three times the CPU of this 2-core machine).
    # The emulated hardware with the fault (the bench's `pdctl-lab hardware`), then the post-checks only
    # (tag verify): the install steps before them change nothing on a converged host and would only cost time.
    faulty = hardware.apply(inv, limit=FAULTY, envvars=LAB_ENV)
    assert faulty.ok, faulty.failures
    result = runner.run_playbook("playbooks/host_stack.yml", inv, limit=FAULTY, tags="verify", envvars=LAB_ENV)
    assert not result.ok
    # The check fails, then host_stack.yml's rescue fails the host with the same message (without
    # pdctl_min_prefill_instances no host is quarantined: tests/integration/test_quarantine_lab.py).
    assert [(f["host"], f["task"]) for f in result.failures] == [
        (FAULTY, task), (FAULTY, "Fail this host with its check's message (it cannot be quarantined)")], result.failures
    assert result.failures[1]["msg"] == result.failures[0]["msg"]
    message = str(result.failures[0]["msg"])
    assert FAULTY in message
    for w in words:
        assert w in message, message
    assert result.stats["failures"].keys() == {FAULTY}
