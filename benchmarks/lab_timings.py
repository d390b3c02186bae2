#!/usr/bin/env python3
"""Print lab timings: image build, hosts up, first converge, no-op re-run.

    .venv/bin/python benchmarks/lab_timings.py [--cold]

Recreates the lab hosts (any state on them is lost). --cold also starts from an empty pdctl cache
(PDCTL_CACHE_DIR: Debian root, apt store, wheelhouse, model; network-bound, the mirrors' speed
dominates it). --noop-only times just the no-op re-runs on the lab as it is (converged).
Target: the no-op re-run of site.yml on three hosts takes <= 45 s and changes nothing on any host.
"""
from __future__ import annotations

import argparse
import os
import re
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
    ap.add_argument("--cold", action="store_true", help="start from an empty cache (temporary)")
    ap.add_argument("--noop-only", action="store_true", help="only the no-op re-runs, on the converged lab")
    ap.add_argument("--runs", type=int, default=1, help="no-op re-runs to time")
    args = ap.parse_args()
    inv = collection.root() / "inventories" / "lab"
    env = {"PDCTL_LAB_DIR": str(collection.root() / ".lab")}
    rows = []
    if args.noop_only:
        return noop_runs(inv, env, rows, args.runs)
    hosts.down()
    if args.cold:
        os.environ["PDCTL_CACHE_DIR"] = tempfile.mkdtemp(prefix="pdctl-cold-")
    else:
        tag = "localhost/pdctl-lab:" + image._digest(image.base_rootfs().name, image.CUSTOMIZE)
        subprocess.run(["podman", "image", "rm", "-f", tag], capture_output=True)
    opts = hosts.container_options()
    timed("image build" + (" (cold)" if args.cold else ""), lambda: image.ensure(opts), rows)
    rc = timed("hosts up", hosts.up, rows)
    if rc:
        sys.exit("lab up failed")
    res = timed("first converge", lambda: runner.run_playbook("site.yml", inv, envvars=env), rows)
    if not res.ok:
        sys.exit("first converge failed: %s" % res.failures)
    return noop_runs(inv, env, rows, args.runs)


def readme_noop(inv, env):
    """The README's main command itself (scripts/lab runs exactly this): `ansible-playbook site.yml -i INV`.
    Returns (ok, changed per host) from its recap."""
    ansible_playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    proc = subprocess.run([ansible_playbook, "site.yml", "-i", str(inv)], cwd=collection.root(),
                          env=dict(os.environ, **env), capture_output=True, text=True)
    changed = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", proc.stdout, re.M)}
    return proc.returncode == 0, changed, proc.stdout[-3000:]


def noop_runs(inv, env, rows, runs):
    for n in range(runs):
        t0 = time.monotonic()
        ok, changed, tail = readme_noop(inv, env)
        took = time.monotonic() - t0
        rows.append(("no-op re-run %d" % (n + 1), took))
        print("%-25s %6.1f s" % ("no-op re-run %d" % (n + 1), took), flush=True)
        if not ok:
            sys.exit("no-op re-run failed:\n%s" % tail)
        print("  changed per host: %s" % (", ".join("%s=%d" % hc for hc in sorted(changed.items())) or "none"))
        if sum(changed.values()):
            print("  NOT a no-op: %d changes" % sum(changed.values()))
    # The same run through ansible-runner (pdctl's commands and CI): its event files cost a few seconds.
    res = timed("no-op via ansible-runner", lambda: runner.run_playbook("site.yml", inv, envvars=env), rows)
    if not res.ok:
        sys.exit("no-op re-run failed: %s" % res.failures)
    noop = min(t for label, t in rows if label.startswith("no-op re-run"))
    print("no-op re-run target <= 45 s: %s (best %.1f s)" % ("met" if noop <= 45 else "MISSED", noop))


if __name__ == "__main__":
    main()
