#!/usr/bin/env python3
"""Print lab timings: image build, hosts up, first converge, no-op re-run.

    .venv/bin/python benchmarks/lab_timings.py [--cold]

Recreates the lab hosts (any state on them is lost). --cold also rebuilds the debootstrap root
in a temporary cache (network-bound: the Debian mirror's speed dominates it).
Target: the no-op re-run of site.yml on three hosts takes <= 60 s.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from pdctl import collection, runner
from pdctl.lab import hosts, image


def timed(label, fn, rows):
    t0 = time.monotonic()
    out = fn()
    rows.append((label, time.monotonic() - t0))
    print("%-22s %7.1f s" % rows[-1], flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cold", action="store_true", help="include debootstrap (temporary cache)")
    args = ap.parse_args()
    inv = collection.root() / "inventories" / "lab"
    env = {"PDCTL_LAB_DIR": str(collection.root() / ".lab")}
    rows = []
    hosts.down()
    if args.cold:
        os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="pdctl-cold-")
    else:
        tag = "localhost/pdctl-lab:" + image._digest(image.base_rootfs().name, image.CUSTOMIZE)
        subprocess.run(["podman", "image", "rm", "-f", tag], capture_output=True)
    opts = hosts.container_options()
    timed("image build" + (" (cold)" if args.cold else ""), lambda: image.ensure(opts), rows)
    rc = timed("hosts up", hosts.up, rows)
    if rc:
        sys.exit("lab up failed")
    for label in ("first converge", "no-op re-run"):
        res = timed(label, lambda: runner.run_playbook("site.yml", inv, envvars=env), rows)
        if not res.ok:
            sys.exit("%s failed: %s" % (label, res.failures))
        print("  changed=%d" % res.total("changed"))
    noop = dict(rows)["no-op re-run"]
    print("no-op re-run target <= 60 s: %s" % ("met" if noop <= 60 else "MISSED"))


if __name__ == "__main__":
    main()
