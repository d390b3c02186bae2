"""Boot order of the rendered instance units (`pdctl render`, production and lab): they require the fabric
manager, want the persistence daemon and openibd, start after all three, and pass the real
`systemd-analyze verify` with the binaries stubbed."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

import requires
from pdctl import cli, collection, inventory

ROOT = collection.root()
# Production's render, however many hosts inventories/b300 has, and the lab's.
INVENTORIES = {"b300": ROOT / "inventories/b300", "lab": ROOT / "inventories/lab"}
VENV_BIN = "/opt/pdctl/venvs/current/bin/"
# What the host stack installs (nvidia_fabric, nvidia_driver); openibd is left out on purpose: Wants= of a
# unit a host lacks (the lab, a host without DOCA-OFED) must not fail.
DEPENDENCIES = ("nvidia-fabricmanager.service", "nvidia-persistenced.service")


@pytest.fixture(scope="module")
def units(tmp_path_factory):
    out = {}
    for inv in ("b300", "lab"):
        d = tmp_path_factory.mktemp(inv)
        assert cli.main(["render", "-i", str(INVENTORIES[inv]), "--out", str(d)]) == 0
        out[inv] = sorted(d.glob("*/etc/systemd/system/pdctl-vllm-*.service"))
        assert len(out[inv]) == len(inventory.plan(INVENTORIES[inv])["instances"]), inv  # one per instance
    return out


def _directive(text, key):
    return [w for line in text.splitlines() if line.startswith(key + "=") for w in line.split("=", 1)[1].split()]


def _stub(venv, text):
    """An executable in venv for the program the unit's ExecStart runs from the release venv (vllm; the lab's engine)."""
    (argv0,) = [line.split("=", 1)[1].split()[0] for line in text.splitlines() if line.startswith("ExecStart=")]
    assert argv0.startswith(VENV_BIN), argv0
    stub = venv / argv0[len(VENV_BIN):]
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)


@pytest.mark.parametrize("inv", ["b300", "lab"])
def test_instances_require_the_fabric_manager_and_start_after_rdma(units, inv):
    for path in units[inv]:
        text = path.read_text()
        assert _directive(text, "Requires") == ["nvidia-fabricmanager.service"], path.name
        assert {"nvidia-persistenced.service", "openibd.service"} <= set(_directive(text, "Wants")), path.name
        assert {"nvidia-fabricmanager.service", "nvidia-persistenced.service", "openibd.service",
                "network-online.target"} <= set(_directive(text, "After")), path.name
        assert not _directive(text, "BindsTo"), "a fabric manager crash must not stop the instances at once"


def test_rendered_units_pass_systemd_analyze_verify(units, tmp_path):
    analyze = requires.binary("systemd-analyze", "verifies the rendered units (package systemd)")
    stubs, venv = tmp_path / "units", tmp_path / "venv"
    stubs.mkdir()
    venv.mkdir()
    for name in DEPENDENCIES:
        (stubs / name).write_text("[Unit]\nDescription=stub of %s\n\n[Service]\nExecStart=/bin/true\n" % name)
    checked = []
    for inv in ("b300", "lab"):
        for path in units[inv]:
            text = path.read_text()
            _stub(venv, text)
            unit = stubs / path.name
            unit.write_text(text.replace(VENV_BIN, str(venv) + "/"))
            # SYSTEMD_UNIT_PATH ending in ':' keeps the system's own unit directories after the stubs.
            res = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                                 env=dict(os.environ, SYSTEMD_UNIT_PATH="%s:" % stubs))
            assert res.returncode == 0 and not res.stderr.strip(), "%s %s: %s" % (inv, path.name, res.stderr)
            checked.append(path.name)
    assert len(checked) == len(units["b300"]) + len(units["lab"])


def test_verify_fails_without_the_fabric_manager(units, tmp_path):
    # The check above is not vacuous: the same unit without the fabric manager installed is refused.
    analyze = requires.binary("systemd-analyze", "verifies the rendered units (package systemd)")
    venv = tmp_path / "venv"
    venv.mkdir()
    path = units["b300"][0]
    _stub(venv, path.read_text())
    unit = tmp_path / path.name
    unit.write_text(path.read_text().replace(VENV_BIN, str(venv) + "/"))
    res = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                         env=dict(os.environ, SYSTEMD_UNIT_PATH="%s:" % tmp_path))
    assert res.returncode != 0
    assert re.search(r"nvidia-fabricmanager\.service not found", res.stderr), res.stderr
