#!/usr/bin/env python3
"""Decode loss under load on the lab, measured: one JSON line at the end (issue 39).

    flock /tmp/pdctl-lab.lock .venv/bin/python benchmarks/faults.py --scenario decode-kill
    flock /tmp/pdctl-lab.lock .venv/bin/python benchmarks/faults.py --scenario decode-host-loss

The scenarios, the load and every field of the line: pdctl.lab.faults (src/pdctl/lab/faults.py).
--ready-after S: every engine takes S seconds to load after each start, as a B300 instance does for minutes
(pdctl.lab.slow_start): the decode comes back that much later, and the line has ready_after_s.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from pdctl.lab import faults, slow_start


def main():
    ap = argparse.ArgumentParser(description=faults.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=faults.SCENARIOS, default="decode-kill")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--crashloop-s", type=float, default=faults.CRASHLOOP_S)
    ap.add_argument("--host-down-s", type=float, default=faults.HOST_DOWN_S,
                    help="decode-host-loss: how long the host stays killed before podman start")
    ap.add_argument("--ready-after", type=float, default=0, metavar="S",
                    help="every engine loads for S seconds after each start (production-like: minutes)")
    args = ap.parse_args()
    if args.ready_after:
        slow_start.apply(Path(tempfile.mkdtemp(prefix="pdctl-faults-bench-")) / "inventory", args.ready_after,
                         faults.log)
    try:
        result = faults.run(args.scenario, clients=args.clients, crashloop_s=args.crashloop_s,
                            host_down_s=args.host_down_s)
    finally:
        if args.ready_after:
            slow_start.restore(sorted({i["host"] for i in faults.inventory.plan(faults.INVENTORY)["instances"]}),
                               faults.log)
    if args.ready_after:
        result["ready_after_s"] = args.ready_after
    print(json.dumps(result))
    return 0 if result["verdict"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
