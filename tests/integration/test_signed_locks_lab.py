"""Signed wheel locks on a lab host (issue 38, acceptance 2): the router role's install step, against the
lab's store, with the key host_base installed on the host. A wheel swapped in the store, and a lock edited
in the store, are each refused with a message naming the file, and nothing is installed.

The tampered files live in a directory of their own under the store (signed with the lab's key like the
store's own locks) and the venv in a temporary directory on the host: both are removed afterwards, so the
store and the hosts are as they were."""
import os
import shutil
import subprocess
import uuid

import pytest
import yaml

from conftest import LAB_ENV
from inventories import ROOT
from pdctl import runner, wheelhouse

pytestmark = [pytest.mark.lab]

STORE = "http://10.89.64.1:8780"
LAB = ROOT / ".lab"
_HOSTS = yaml.safe_load((ROOT / "inventories/lab/hosts.yml").read_text())["all"]["children"]
HOST = sorted(_HOSTS["router"]["hosts"])[0]
# Another host on the lab network and store (the molecule scenarios' own host), for a run beside the lab.
INVENTORY = ROOT / os.environ.get("PDCTL_SIGNED_LOCKS_INVENTORY", "inventories/lab")
HOST = os.environ.get("PDCTL_SIGNED_LOCKS_HOST", HOST)


def _install(tmp_path, name, version, venvs):
    play = [{"name": "router install from a tampered store", "hosts": HOST, "become": True, "gather_facts": False,
             "tasks": [{"name": "Install step under test", "ansible.builtin.include_role": {
                 "name": "pdctl.vllm_pd.router", "tasks_from": "0010-install.yml"}}]}]
    book = tmp_path / ("%s.yml" % version)
    book.write_text(yaml.safe_dump(play))
    return runner.run_playbook(str(book), INVENTORY, envvars=LAB_ENV, extravars={
        "router_version": version, "router_venvs_dir": venvs,
        "router_wheelhouse_url": "%s/%s/wheels/" % (STORE, name),
        "router_requirements_lock_url": "%s/%s/locks/%s" % (STORE, name, wheelhouse.signed_name("router-" + version))})


def _left(host, venvs):
    res = subprocess.run(["podman", "exec", host, "sh", "-c", "ls %s/*/lib/python3*/site-packages 2>/dev/null || true"
                          % venvs], capture_output=True, text=True)
    return [n for n in res.stdout.split() if n.startswith(("alpha", "beta"))]


def test_host_refuses_a_swapped_wheel_and_an_edited_lock(converged_lab, tmp_path):
    name = "tamper-%s" % uuid.uuid4().hex[:8]
    root = LAB / "store" / name
    venvs = "/tmp/pdctl-%s" % name
    try:
        for sub in ("wheels", "locks"):
            (root / sub).mkdir(parents=True)
        wheelhouse.build_pure_wheel(root / "wheels", "alpha", "1.0", {"alpha/__init__.py": b""}, ["beta==2.0"])
        wheelhouse.build_pure_wheel(root / "wheels", "beta", "2.0", {"beta/__init__.py": b""}, [])
        for version in ("swap", "edit"):
            lock = wheelhouse.write_lock(root / "wheels", "router-" + version, ["alpha==1.0"])
            wheelhouse.sign_lock(LAB / "apt-signing", lock, root / "locks")
        # A wheel swapped in the store: same name, other bytes.
        beta = wheelhouse.build_pure_wheel(root / "wheels", "beta", "2.0", {"beta/__init__.py": b"evil = 1\n"}, [])
        result = _install(tmp_path, name, "swap", venvs)
        assert not result.ok
        message = " ".join(str(f["msg"]) for f in result.failures)
        assert "DO NOT MATCH THE HASHES" in message and "%s/%s/wheels/%s" % (STORE, name, beta.name) in message, message
        # A lock edited in the store: the swapped wheel's hash written into the signed text.
        signed = root / "locks" / wheelhouse.signed_name("router-edit")
        old = wheelhouse.read_lock(root / "wheels" / wheelhouse.lock_name("router-edit"))["beta"][1][0]
        signed.write_text(signed.read_text().replace(old, wheelhouse._sha256(beta)))
        result = _install(tmp_path, name, "edit", venvs)
        assert not result.ok
        assert {f["task"] for f in result.failures} == {"The lock is signed by the artifact store's key"}
        message = str(result.failures[0]["msg"])
        assert "%s/%s/locks/%s does not verify" % (STORE, name, signed.name) in message, message
        assert "BAD signature" in message, message
        assert not _left(HOST, venvs), "a refused install left packages on %s" % HOST
    finally:
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["podman", "exec", HOST, "rm", "-rf", venvs], capture_output=True)
