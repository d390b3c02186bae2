"""Role task files run offline on the controller (connection local, no host): the checks that must
refuse a bad manifest or inventory before anything is installed."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from inventories import ROOT

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
MANIFEST = yaml.safe_load((ROOT / "inventories/b300/group_vars/all/versions.yml").read_text())["pdctl_versions"]


def run_role_tasks(tmp_path, role, tasks_from, extravars, pre_tasks=(), env=None):
    """Run roles/<role>/tasks/<tasks_from> on localhost; returns (ok, output)."""
    play = [{
        "name": "offline role tasks",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable},
        "tasks": list(pre_tasks) + [{"name": "tasks under test", "ansible.builtin.include_role":
                                     {"name": "pdctl.vllm_pd." + role, "tasks_from": tasks_from}}],
    }]
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump(play))
    varfile = tmp_path / "vars.json"
    varfile.write_text(json.dumps(extravars))
    res = subprocess.run([ANSIBLE_PLAYBOOK, str(book), "-i", "localhost,", "-e", "@%s" % varfile],
                         cwd=ROOT, capture_output=True, text=True,
                         env={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": "/usr/bin:/bin",
                              "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "HOME": str(tmp_path),
                              **(env or {})})
    return res.returncode == 0, res.stdout + res.stderr


# ---------------------------------------------------------------- item 1: NVLSM is versioned by date

def test_manifest_pins_nvlsm_by_date_and_fabric_packages_at_the_driver():
    assert MANIFEST["nvidia_fabricmanager"] == MANIFEST["nvidia_driver"]
    assert MANIFEST["libnvidia_nscq"] == MANIFEST["nvidia_driver"]
    assert MANIFEST["nvlsm"] != MANIFEST["nvidia_driver"]
    year, month, day = (int(x) for x in MANIFEST["nvlsm"].split("."))
    assert year >= 2025 and 1 <= month <= 12 and 1 <= day <= 31


def test_versions_check_accepts_the_manifest(tmp_path):
    ok, out = run_role_tasks(tmp_path, "nvidia_fabric", "versions.yml", {"pdctl_versions": MANIFEST})
    assert ok, out


def test_versions_check_refuses_a_driver_versioned_nvlsm(tmp_path):
    ok, out = run_role_tasks(tmp_path, "nvidia_fabric", "versions.yml",
                             {"pdctl_versions": dict(MANIFEST, nvlsm=MANIFEST["nvidia_driver"])})
    assert not ok
    assert "nvlsm %s" % MANIFEST["nvidia_driver"] in out and "versioned by date" in out


def test_versions_check_refuses_nscq_or_fabric_manager_off_the_driver(tmp_path):
    for key in ("libnvidia_nscq", "nvidia_fabricmanager"):
        ok, out = run_role_tasks(tmp_path, "nvidia_fabric", "versions.yml",
                                 {"pdctl_versions": dict(MANIFEST, **{key: "580.82.07"})})
        assert not ok, key
        assert "580.82.07" in out and "must be the same version" in out, out


# ---------------------------------------------------------------- item 8: persistence mode for real

def emulated_gpus(tmp_path, profile=None, persistence_state=None):
    """PATH entries and environment that make `nvidia-smi` the lab emulator with this profile."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexec %s %s \"$@\"\n" % (sys.executable, ROOT / "src/pdctl/lab/fakegpu/nvidia_smi.py"))
    smi.chmod(0o755)
    (tmp_path / "profile.json").write_text(json.dumps(profile or {}))
    env = {"PATH": "%s:/usr/bin:/bin" % bindir, "PDCTL_HW_PROFILE": str(tmp_path / "profile.json"),
           "PDCTL_FAKEGPU_PERSISTENCE_STATE": str(tmp_path / "persistence")}
    if persistence_state:
        (tmp_path / "persistence").write_text(persistence_state + "\n")
    return env


DRIVER_VARS = {"pdctl_versions": MANIFEST, "pdctl_gpu_count": 8, "pdctl_gpu_bus_ids": [],
               "pdctl_cuda_apt_repo": {}, "pdctl_real_kernel": False}
NOT_CHANGED = [{"name": "packages unchanged", "ansible.builtin.set_fact": {
    "_nvidia_driver_install": {"changed": False}, "_nvidia_driver_kernel_install": {"changed": False}}}]


def test_driver_post_check_passes_with_persistence_mode_on(tmp_path):
    env = emulated_gpus(tmp_path, {"driver_version": MANIFEST["nvidia_driver"]}, "Enabled")
    ok, out = run_role_tasks(tmp_path, "nvidia_driver", "0060-verify.yml", DRIVER_VARS, NOT_CHANGED, env)
    assert ok, out


def test_driver_post_check_names_gpus_without_persistence_mode(tmp_path):
    """What Ubuntu's packaged unit (--no-persistence-mode) leaves: the post-check must fail."""
    env = emulated_gpus(tmp_path, {"driver_version": MANIFEST["nvidia_driver"]}, "Disabled")
    ok, out = run_role_tasks(tmp_path, "nvidia_driver", "0060-verify.yml", DRIVER_VARS, NOT_CHANGED, env)
    assert not ok
    assert "GPU 0 (00000000:17:00.0): Persistence Mode Disabled, expected Enabled" in out, out
    assert "GPU 7 (00000000:EB:00.0)" in out


def test_persistence_daemon_runs_with_persistence_mode_on():
    for os_name in ("Ubuntu", "Debian"):
        data = yaml.safe_load((ROOT / ("roles/nvidia_driver/vars/%s.yml" % os_name)).read_text())
        command = data["nvidia_driver_persistenced_command"]
        assert "--persistence-mode" in command and "--no-persistence-mode" not in command
    text = (ROOT / "roles/nvidia_driver/templates/persistenced-mode.conf.j2").read_text()
    assert "ExecStart=\n" in text  # clears the packaged command line before setting ours


def test_lab_persistenced_standin_behaves_like_ubuntus_package(tmp_path):
    from pdctl.lab import standin_debs
    from pdctl.lab.fakegpu import nvidia_smi

    (unit,) = [s for s in standin_debs.standins() if s.name == "nvidia-persistenced"]
    text = unit.files["/lib/systemd/system/nvidia-persistenced.service"][0]
    assert "--no-persistence-mode" in text
    state = tmp_path / "state"
    state.write_text("Disabled\n")
    import os
    os.environ["PDCTL_FAKEGPU_PERSISTENCE_STATE"] = str(state)
    try:
        rc, out = nvidia_smi.run(["-q"], nvidia_smi.copy.deepcopy(nvidia_smi.DEFAULT_PROFILE))
    finally:
        del os.environ["PDCTL_FAKEGPU_PERSISTENCE_STATE"]
    assert rc == 0 and re.search(r"^\s+Persistence Mode\s+: Disabled$", out, re.M), out


# ---------------------------------------------------------------- rdma: every port state in one read

def _sysfs(tmp_path, states):
    root = tmp_path / "infiniband"
    for dev, state in states.items():
        port = root / dev / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text(state + "\n")
    return root


def test_rdma_verify_passes_when_every_named_port_is_active(tmp_path):
    root = _sysfs(tmp_path, {"mlx5_0": "4: ACTIVE", "mlx5_1": "4: ACTIVE", "mlx5_2": "1: DOWN"})
    ok, out = run_role_tasks(tmp_path, "rdma", "0040-verify.yml",
                             {"rdma_devices": ["mlx5_0", "mlx5_1"], "rdma_infiniband_sysfs": str(root), "rdma_port": 1})
    assert ok, out  # mlx5_2 is down but not named


def test_rdma_verify_names_a_down_port_and_a_missing_device(tmp_path):
    root = _sysfs(tmp_path, {"mlx5_0": "4: ACTIVE", "mlx5_6": "1: DOWN"})
    ok, out = run_role_tasks(tmp_path, "rdma", "0040-verify.yml",
                             {"rdma_devices": ["mlx5_0", "mlx5_6", "mlx5_7"], "rdma_infiniband_sysfs": str(root),
                              "rdma_port": 1})
    assert not ok
    assert "device mlx5_6 port 1: state 1: DOWN, expected ACTIVE" in out, out
    assert "device mlx5_7 port 1: not present, expected ACTIVE" in out, out
    assert "device mlx5_0" not in out.split("RDMA devices not ready")[-1]
