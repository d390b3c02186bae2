"""Role task files run offline on the controller (connection local, no host): the checks that must
refuse a bad manifest or inventory before anything is installed."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from inventories import ROOT, group_var

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

    (unit,) = [s for s in standin_debs.standins(rehearsal=False) if s.name == "nvidia-persistenced"]
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


# ---------------------------------------------------------------- item 7: boot order and kernel modules

KERNEL = subprocess.run(["uname", "-r"], capture_output=True, text=True, check=True).stdout.strip()
SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-e0a9e58f6b8c"


def kernel_tree(tmp_path, headers=True, secure_boot=None):
    """A /lib/modules with (or without) the running kernel's build tree, and an efivars directory whose
    SecureBoot variable is 4 attribute bytes + the state (None: no variable, a legacy BIOS boot)."""
    modules = tmp_path / "modules"
    (modules / KERNEL).mkdir(parents=True)
    if headers:
        (tmp_path / "headers").mkdir()
        (tmp_path / "headers" / "Makefile").write_text("# kernel headers\n")
        (modules / KERNEL / "build").symlink_to(tmp_path / "headers")
    efivars = tmp_path / "efivars"
    efivars.mkdir()
    if secure_boot is not None:
        (efivars / SECURE_BOOT_VAR).write_bytes(bytes([6, 0, 0, 0, secure_boot]))
    return {"preflight_modules_dir": str(modules), "preflight_efivars_dir": str(efivars),
            "pdctl_secure_boot_allowed": False, "_preflight_mok_certificate": "/var/lib/shim-signed/mok/MOK.der"}


def test_preflight_kernel_passes_with_headers_and_secure_boot_off(tmp_path):
    for state in (0, None):  # off, or no EFI variable at all (legacy boot)
        sub = tmp_path / str(state)
        sub.mkdir()
        ok, out = run_role_tasks(sub, "preflight", "0040-kernel.yml", kernel_tree(sub, secure_boot=state))
        assert ok, out
        assert "changed=0" in out, out  # read-only probes


def test_preflight_kernel_names_the_missing_headers_package(tmp_path):
    ok, out = run_role_tasks(tmp_path, "preflight", "0040-kernel.yml", kernel_tree(tmp_path, headers=False))
    assert not ok
    assert "no headers for the running kernel %s" % KERNEL in out, out
    assert "apt-get install linux-headers-%s" % KERNEL in out and "Nothing was changed" in out


def test_preflight_kernel_refuses_secure_boot_unless_the_site_signs_dkms_modules(tmp_path):
    vars_ = kernel_tree(tmp_path, secure_boot=1)
    ok, out = run_role_tasks(tmp_path, "preflight", "0040-kernel.yml", vars_)
    assert not ok
    assert "Secure Boot is enabled" in out and "mokutil --import /var/lib/shim-signed/mok/MOK.der" in out, out
    assert "pdctl_secure_boot_allowed: true" in out
    ok, out = run_role_tasks(tmp_path, "preflight", "0040-kernel.yml", dict(vars_, pdctl_secure_boot_allowed=True))
    assert ok, out


def test_preflight_kernel_checks_are_gated_by_the_real_kernel_switch_and_probes_are_read_only():
    main = yaml.safe_load((ROOT / "roles/preflight/tasks/main.yml").read_text())
    (step,) = [t for t in main if t.get("ansible.builtin.include_tasks") == "0040-kernel.yml"]
    assert "preflight_real_kernel | bool" in step["when"]
    defaults = yaml.safe_load((ROOT / "roles/preflight/defaults/main.yml").read_text())
    assert defaults["preflight_real_kernel"] == "{{ pdctl_real_kernel }}"
    for task in yaml.safe_load((ROOT / "roles/preflight/tasks/0040-kernel.yml").read_text()):
        if "ansible.builtin.command" in task:
            assert task["changed_when"] is False and task["check_mode"] is False, task["name"]
    for inv, allowed in (("b300", False), ("lab", False)):
        assert group_var(inv, "pdctl_secure_boot_allowed") is allowed


def fabric_boot_files(tmp_path, nvlink5):
    """roles/nvidia_fabric 0035-boot-order.yml offline in check mode on a fresh host (the fabric packages would
    be installed, so there is no unit to restart yet): {file: content it would write}."""
    os_vars = yaml.safe_load((ROOT / "roles/nvidia_fabric/vars/Ubuntu.yml").read_text())
    pre = [{"name": "NVLink 5 decided, fabric packages about to be installed", "ansible.builtin.set_fact": {
        "_nvidia_fabric_nvlink5": nvlink5, "_nvidia_fabric_install": {"changed": True}}}]
    book = tmp_path / "play.yml"
    play = [{"name": "offline", "hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars": {"ansible_python_interpreter": sys.executable},
             "tasks": pre + [{"name": "tasks under test", "ansible.builtin.include_role":
                              {"name": "pdctl.vllm_pd.nvidia_fabric", "tasks_from": "0035-boot-order.yml"}}]}]
    book.write_text(yaml.safe_dump(play))
    varfile = tmp_path / "vars.json"
    varfile.write_text(json.dumps(dict(os_vars, pdctl_versions=MANIFEST)))
    res = subprocess.run([ANSIBLE_PLAYBOOK, str(book), "-i", "localhost,", "-e", "@%s" % varfile, "--check", "--diff"],
                         cwd=ROOT, capture_output=True, text=True,
                         env={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": "/usr/bin:/bin",
                              "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "HOME": str(tmp_path),
                              "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"})
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout[res.stdout.index("{"):])
    written = {}  # task name -> the file content its diff shows
    for task in out["plays"][0]["tasks"]:
        res_ = task["hosts"]["localhost"]
        for diff in res_.get("diff") or []:
            if isinstance(diff, dict) and isinstance(diff.get("after"), str) and not res_.get("skipped"):
                written[task["task"]["name"].split(" : ", 1)[-1]] = diff["after"]
    dests = {"NVLSM's transport modules load at boot (NVLink 5)": "/etc/modules-load.d/pdctl-nvlsm.conf",
             "Fabric manager starts after the boot-time modules and the persistence daemon":
                 "/etc/systemd/system/nvidia-fabricmanager.service.d/pdctl-order.conf"}
    tasks = {t["name"]: t for t in yaml.safe_load((ROOT / "roles/nvidia_fabric/tasks/0035-boot-order.yml").read_text())}
    for name, dest in dests.items():
        assert tasks[name]["ansible.builtin.template"]["dest"].replace("{{ nvidia_fabric_service }}",
                                                                       "nvidia-fabricmanager") == dest
    return {dests[name]: text for name, text in written.items() if name in dests}


def test_nvlink5_hosts_load_ib_umad_at_boot_before_the_fabric_manager(tmp_path):
    files = fabric_boot_files(tmp_path, True)
    modules = [line for line in files["/etc/modules-load.d/pdctl-nvlsm.conf"].splitlines()
               if line and not line.startswith("#")]
    assert modules == ["mlx5_core", "ib_umad"]
    dropin = files["/etc/systemd/system/nvidia-fabricmanager.service.d/pdctl-order.conf"]
    after = [w for line in dropin.splitlines() if line.startswith("After=") for w in line[6:].split()]
    assert "systemd-modules-load.service" in after and "nvidia-persistenced.service" in after


def test_hosts_without_nvlink5_get_the_ordering_but_no_nvlsm_modules(tmp_path):
    files = fabric_boot_files(tmp_path, False)
    assert "/etc/modules-load.d/pdctl-nvlsm.conf" not in files
    assert "systemd-modules-load.service" in files["/etc/systemd/system/nvidia-fabricmanager.service.d/pdctl-order.conf"]


def test_doca_ofed_goes_in_before_the_fabric_and_activates_through_a_handler():
    plays = yaml.safe_load((ROOT / "playbooks/host_stack.yml").read_text())
    (stack,) = [t for t in plays[0]["tasks"] if "block" in t]  # the roles, in a block (quarantine's rescue)
    # ... one list of them, which host maintenance (playbooks/maintenance.yml) runs too
    assert [t.get("ansible.builtin.import_tasks") for t in stack["block"]] == ["tasks/host_stack_roles.yml"]
    roles = yaml.safe_load((ROOT / "playbooks/tasks/host_stack_roles.yml").read_text())
    order = [(t.get("ansible.builtin.import_role") or t["ansible.builtin.include_role"])["name"].split(".")[-1]
             for t in roles]
    # The driver first; the lab's emulated hardware is not here: the bench writes it before (pdctl-lab up,
    # src/pdctl/lab/ansible/hardware.yml), so production loads no lab role.
    assert order[0] == "nvidia_driver" and "lab_hardware" not in order, order
    assert all("ansible.builtin.import_role" in t for t in roles)
    assert order.index("rdma") < order.index("nvidia_fabric"), order
    tasks = yaml.safe_load((ROOT / "roles/rdma/tasks/0010-packages.yml").read_text())
    (doca,) = [t for t in tasks if "DOCA-OFED is installed" in t["name"]]
    assert doca["notify"] == "rdma doca-ofed changed" and "_rdma_doca_pinned" in doca["ansible.builtin.apt"]["name"]
    main = yaml.safe_load((ROOT / "roles/rdma/tasks/main.yml").read_text())
    steps = [t.get("ansible.builtin.import_tasks") for t in main]
    assert steps.index("0015-activate.yml") == steps.index("0010-packages.yml") + 1  # flushed before the rest
    assert yaml.safe_load((ROOT / "roles/rdma/tasks/0015-activate.yml").read_text())[0][
        "ansible.builtin.meta"] == "flush_handlers"
    handlers = {h["name"]: h for h in yaml.safe_load((ROOT / "roles/rdma/handlers/main.yml").read_text())}
    openibd = handlers["Restart openibd onto the new DOCA-OFED modules"]
    reboot = handlers["Reboot onto the new DOCA-OFED modules"]
    assert openibd["listen"] == reboot["listen"] == "rdma doca-ofed changed"
    assert openibd["ansible.builtin.systemd_service"] == {"name": "{{ rdma_openibd_service }}", "state": "restarted",
                                                          "daemon_reload": True}
    for handler in (openibd, reboot):
        assert "rdma_real_kernel | bool" in handler["when"]  # the lab writes files, reloads nothing
    for os_name in ("Ubuntu", "Debian"):
        assert yaml.safe_load((ROOT / ("roles/rdma/vars/%s.yml" % os_name)).read_text())[
            "rdma_openibd_service"] == "openibd"


def test_doca_ofed_handlers_do_nothing_without_a_real_kernel(tmp_path):
    """The handlers run offline (notified as the install would notify them): the lab skips both."""
    play = [{"name": "offline handlers", "hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars": {"ansible_python_interpreter": sys.executable, "rdma_real_kernel": False,
                      "rdma_doca_activation": "openibd", "rdma_openibd_service": "openibd",
                      "rdma_reboot_timeout": 10, "_rdma_doca_install": {"changed": True}},
             "handlers": [{"name": "DOCA-OFED handlers", "ansible.builtin.import_tasks":
                           str(ROOT / "roles/rdma/handlers/main.yml")}],
             "tasks": [{"name": "DOCA-OFED changed", "ansible.builtin.debug": {"msg": "installed"},
                        "changed_when": True, "notify": "rdma doca-ofed changed"}]}]
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump(play))
    res = subprocess.run([ANSIBLE_PLAYBOOK, str(book), "-i", "localhost,", "--check"], cwd=ROOT,
                         capture_output=True, text=True,
                         env={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": "/usr/bin:/bin",
                              "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "HOME": str(tmp_path),
                              "ANSIBLE_DISPLAY_SKIPPED_HOSTS": "true"})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "RUNNING HANDLER [Restart openibd onto the new DOCA-OFED modules]" in out, out
    assert "RUNNING HANDLER [Reboot onto the new DOCA-OFED modules]" in out
    assert "changed=1" in out and "skipped=2" in out  # only the notifying task: both handlers skipped
