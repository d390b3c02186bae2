"""The lab with production-like engine load times (issue 37): a copy of inventories/lab in which every
instance's engine profile keeps its port closed for `ready_after_s` after each start (faults.slow_start_s:
vLLM binds but listens only once ~460 GB of weights are loaded and CUDA graphs captured), the readiness
timeouts allow for it, and the rollout timing model's engine_ready_s includes it.

benchmarks/upgrade.py and benchmarks/faults.py take `--ready-after S`: apply() puts the instances on the
slow profile before the scenario (every instance restarts once, no load yet), the scenario runs against
the copy, and restore() puts the lab's own profile back after (the instances restart with it, fast)."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import yaml

from pdctl import collection

ROOT = collection.root()
LAB_INVENTORY = ROOT / "inventories" / "lab"
# Installed beside the lab's profile, as an operator would add a profile file (the inventory's pdctl_engine).
HOST_PROFILE = "/etc/pdctl/engine/profile-slow-start.yml"


def inventory(dest: Path, ready_after_s: float) -> Path:
    """The copy of the lab inventory at dest (links resolved), with the slow-start profile on every host."""
    lab_dir = Path(os.environ.get("PDCTL_LAB_DIR") or ROOT / ".lab")
    profile = yaml.safe_load((lab_dir / "engine" / "profile.yml").read_text())
    profile["faults"] = dict(profile.get("faults") or {}, slow_start_s=ready_after_s)
    dest = Path(dest)
    shutil.copytree(LAB_INVENTORY, dest, symlinks=False)
    src = dest.parent / (dest.name + "-profile-slow-start.yml")  # (not inside: Ansible would read it as inventory)
    src.write_text(yaml.safe_dump(profile))
    group_vars = dest / "group_vars" / "all"
    engine = yaml.safe_load((group_vars / "engine.yml").read_text())["pdctl_engine"]
    timing = yaml.safe_load((group_vars / "rollout.yml").read_text())["pdctl_rollout_timing"]
    slow = {
        "pdctl_engine": dict(engine, files=engine["files"] + [{"src": str(src), "dest": HOST_PROFILE}],
                             environment=dict(engine["environment"], PDCTL_ENGINE_PROFILE=HOST_PROFILE),
                             # A load of ready_after_s, then the lab's own two minutes of slack.
                             ready_timeout_s=int(ready_after_s) + int(engine["ready_timeout_s"])),
        "pdctl_rollout_timing": dict(timing, engine_ready_s=timing["engine_ready_s"] + ready_after_s),
        # The copy is not beside .lab: it still means this checkout's lab (connection.yml reads PDCTL_LAB_DIR).
        "pdctl_lab_dir": str(lab_dir),
    }
    # Sorted after the originals, so it wins like an operator's edit of the same files.
    (group_vars / "zz-slow-start.yml").write_text(yaml.safe_dump(slow))
    return dest


def converge_engines(inventory_dir: Path, log) -> tuple[int, float]:
    """site.yml's vllm role on every host (instances restart on a changed profile): (exit code, seconds)."""
    t0 = time.monotonic()
    cmd = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "site.yml", "-i", str(inventory_dir), "--tags", "vllm"]
    log("engines on %s: %s" % (inventory_dir, " ".join(cmd[1:])))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ))
    took = time.monotonic() - t0
    if proc.returncode:
        log("exit %d: %s" % (proc.returncode, proc.stdout[-2000:]))
    return proc.returncode, took


def apply(dest: Path, ready_after_s: float, log) -> Path:
    """The copy, and every instance running on its slow profile (raises if the play fails)."""
    inv = inventory(dest, ready_after_s)
    rc, took = converge_engines(inv, log)
    if rc:
        raise RuntimeError("the instances did not start on the slow-start profile (exit %d)" % rc)
    log("instances ready on the slow-start profile (%.0f s load) after %.0f s" % (ready_after_s, took))
    return inv


def restore(hosts, log) -> int:
    """The lab's own profile on every instance again, and the slow profile's file gone from the hosts."""
    rc, took = converge_engines(LAB_INVENTORY, log)
    for host in hosts:
        subprocess.run(["podman", "exec", host, "rm", "-f", HOST_PROFILE], check=False, capture_output=True)
    log("instances back on the lab's profile after %.0f s (exit %d)" % (took, rc))
    return rc
