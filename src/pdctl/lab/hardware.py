"""The lab hosts' emulated hardware: src/pdctl/lab/ansible/hardware.yml (role lab_hardware) run through
ansible-runner. The bench applies it, never the collection's playbooks: `pdctl-lab up` once the lab's hosts
answer, `pdctl-lab hardware` (and the lab tests, the upgrade benchmark) to put a fault in from an inventory
variant or the inventory's own profile back. What it writes stays on the hosts' disks across reboots (a
maintenance turn's), so nothing needs it again until the inventory's hardware changes."""
from __future__ import annotations

import os
from pathlib import Path

from pdctl import collection, runner

PLAYBOOK = Path(__file__).resolve().parent / "ansible" / "hardware.yml"


def apply(inventory, *, limit: str | None = None, extra_args: list[str] | None = None,
          envvars: dict | None = None, quiet: bool = True) -> runner.PlaybookResult:
    """Write the emulated hardware of `inventory`'s serving hosts (or those of `limit`); extra_args go to
    ansible-playbook (`-e @vars.yml`). The lab directory (keys, secrets) is the checkout's unless
    PDCTL_LAB_DIR names another: an inventory variant in a temporary directory has no .lab beside it."""
    env = {"PDCTL_LAB_DIR": os.environ.get("PDCTL_LAB_DIR") or str(collection.root() / ".lab")}
    env.update(envvars or {})
    return runner.run_playbook(str(PLAYBOOK), inventory, limit=limit, extra_args=extra_args, envvars=env,
                               quiet=quiet)
