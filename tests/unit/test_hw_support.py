"""Shared helpers for the hardware-layer tests (no tests here)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from pdctl.lab.fakegpu import nvidia_smi as fake

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hw"

FAKE_ENV = {"PDCTL_FAKEGPU_SEED": "fixture", "PDCTL_FAKEGPU_TIME": "Sun Nov 29 12:00:00 2026"}
FAKE_COMMANDS = {
    "nvidia-smi.txt": [],
    "nvidia-smi-q.xml": ["-q", "-x"],
    "nvidia-smi-q.txt": ["-q"],
    "nvlink-status.txt": ["nvlink", "--status"],
    "nvlink-errors.txt": ["nvlink", "-e"],
    "topo-m.txt": ["topo", "-m"],
    "query.csv": ["--query-gpu=index,uuid,name,pci.bus_id,driver_version,fabric.state,fabric.status,"
                  "ecc.mode.current,ecc.errors.uncorrected.volatile.total", "--format=csv"],
    "version.txt": ["--version"],
}


def profile(**faults):
    return fake._merge(fake.DEFAULT_PROFILE, {"faults": faults} if faults else {})


def emulate(argv, prof=None, monkeypatch=None):
    if monkeypatch:
        for key, value in FAKE_ENV.items():
            monkeypatch.setenv(key, value)
    return fake.run(argv, prof if prof is not None else profile())


def write_profile(tmp_path, prof):
    path = tmp_path / "hw-profile.json"
    path.write_text(json.dumps(prof))
    return path


def fake_bin(tmp_path, prof):
    """An executable `nvidia-smi` that runs the emulator with this profile (as installed on lab hosts)."""
    path = write_profile(tmp_path, prof)
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\nPDCTL_HW_PROFILE=%s PDCTL_FAKEGPU_SEED=fixture exec %s %s \"$@\"\n"
                      % (path, sys.executable, fake.__file__))
    script.chmod(0o755)
    return script
