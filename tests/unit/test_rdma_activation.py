"""DOCA-OFED activation never cuts the connection it runs over (roles/rdma/tasks/0005-management-nic.yml):
the drivers under the default route's and the SSH connection's interfaces are read (bonds, VLANs and bridges
through their lower devices), and rdma_doca_activation=auto reboots where one is a ConnectX (mlx5_core)
instead of restarting openibd. Run against a fake /sys/class/net and a fake `ip`."""
from __future__ import annotations

import os
import subprocess
import sys

import jinja2
import pytest
import yaml

from pdctl import collection

ROOT = collection.root()
TASKS = ROOT / "roles/rdma/tasks/0005-management-nic.yml"
ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")

FAKE_IP = """#!/bin/sh
# ip -o route show default | ip -o route get ADDRESS
[ -n "$FAKE_IP_FAIL" ] && { echo "ip: cannot talk to the kernel" >&2; exit 1; }
case "$3" in
  show) echo "default via 10.0.0.1 dev $FAKE_DEFAULT_DEV proto static" ;;
  get) echo "$4 via 10.0.0.1 dev ${FAKE_SSH_DEV:-$FAKE_DEFAULT_DEV} src 10.0.0.5 uid 0" ;;
esac
"""


def _sysfs(root, nics):
    """nics: {interface: driver or None (virtual) , or a list of lower interfaces}."""
    for dev, what in nics.items():
        d = root / dev
        d.mkdir(parents=True)
        if isinstance(what, list):
            for lower in what:
                (d / ("lower_" + lower)).symlink_to("../" + lower)
        elif what:
            drv = root.parent / "drivers" / what
            drv.mkdir(parents=True, exist_ok=True)
            (d / "device").mkdir()
            (d / "device" / "driver").symlink_to(drv)
    return root


def _script(sysfs):
    cmd = yaml.safe_load(TASKS.read_text())[0]["ansible.builtin.shell"]["cmd"]
    return jinja2.Template(cmd).render(rdma_net_sysfs=str(sysfs))


def _env(tmp_path, **fake):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ip").write_text(FAKE_IP)
    (bin_dir / "ip").chmod(0o755)
    env = {"PATH": "%s:/usr/bin:/bin" % bin_dir, "FAKE_DEFAULT_DEV": "mgmt0"}
    env.update({k: v for k, v in fake.items() if v is not None})
    return env


@pytest.mark.parametrize("nics,ssh_dev,expected", [
    ({"mgmt0": "mlx5_core"}, None, ["mgmt0 mlx5_core"]),
    ({"mgmt0": "igb"}, None, ["mgmt0 igb"]),
    ({"mgmt0": None}, None, []),                                             # virtual (a container's veth)
    ({"mgmt0": ["eno1", "ens1f0"], "eno1": "igb", "ens1f0": "mlx5_core"}, None, ["eno1 igb", "ens1f0 mlx5_core"]),
    ({"mgmt0": ["bond0"], "bond0": ["ens1f0"], "ens1f0": "mlx5_core"}, None, ["ens1f0 mlx5_core"]),  # VLAN on a bond
    ({"mgmt0": "igb", "ens2": "mlx5_core"}, "ens2", ["ens2 mlx5_core", "mgmt0 igb"]),  # SSH over another NIC
])
def test_the_drivers_under_the_management_interfaces_are_read(tmp_path, nics, ssh_dev, expected):
    sysfs = _sysfs(tmp_path / "net", nics)
    env = _env(tmp_path, FAKE_SSH_DEV=ssh_dev, SSH_CONNECTION="10.0.0.9 50000 10.0.0.5 22")
    res = subprocess.run(["bash", "-c", _script(sysfs)], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == expected


def test_an_unreadable_route_is_a_failure_not_an_empty_answer(tmp_path):
    sysfs = _sysfs(tmp_path / "net", {"mgmt0": "igb"})
    res = subprocess.run(["bash", "-c", _script(sysfs)], env=_env(tmp_path, FAKE_IP_FAIL="1"),
                         capture_output=True, text=True)
    assert res.returncode != 0


def test_auto_reboots_a_host_managed_over_a_connectx_and_restarts_openibd_elsewhere(tmp_path):
    hosts = {"connectx": {"mgmt0": "mlx5_core"}, "onboard": {"mgmt0": "igb"}, "veth": {"mgmt0": None}}
    inventory = {"all": {"hosts": {name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                          "rdma_net_sysfs": str(_sysfs(tmp_path / name / "net", nics))}
                                   for name, nics in hosts.items()}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    play = [{"name": "activation", "hosts": "all", "gather_facts": False,
             "vars": {"rdma_doca_activation": "auto", "rdma_openibd_drivers": ["mlx5_core"]},
             "tasks": [{"name": "management NIC", "ansible.builtin.import_tasks": str(TASKS)},
                       {"name": "chosen", "ansible.builtin.debug": {"msg": "CHOSEN {{ inventory_hostname }} {{ _rdma_activation }}"}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = _env(tmp_path)
    env.update({"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
                "HOME": str(tmp_path)})
    res = subprocess.run([ANSIBLE_PLAYBOOK, str(tmp_path / "play.yml"), "-i", str(tmp_path / "inventory.yml")],
                         cwd=ROOT, capture_output=True, text=True, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for host, chosen in (("connectx", "reboot"), ("onboard", "openibd"), ("veth", "openibd")):
        assert "CHOSEN %s %s" % (host, chosen) in out, out
