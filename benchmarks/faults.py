#!/usr/bin/env python3
"""Decode loss under load on the lab, measured: one JSON line at the end (issue 39).

    flock /tmp/pdctl-lab.lock .venv/bin/python benchmarks/faults.py --scenario decode-kill
    flock /tmp/pdctl-lab.lock .venv/bin/python benchmarks/faults.py --scenario decode-host-loss

The scenarios, the load and every field of the line: pdctl.lab.faults (src/pdctl/lab/faults.py).
"""
from __future__ import annotations

import argparse
import json
import sys

from pdctl.lab import faults


def main():
    ap = argparse.ArgumentParser(description=faults.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=faults.SCENARIOS, default="decode-kill")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--crashloop-s", type=float, default=faults.CRASHLOOP_S)
    ap.add_argument("--host-down-s", type=float, default=faults.HOST_DOWN_S,
                    help="decode-host-loss: how long the host stays killed before podman start")
    args = ap.parse_args()
    result = faults.run(args.scenario, clients=args.clients, crashloop_s=args.crashloop_s,
                        host_down_s=args.host_down_s)
    print(json.dumps(result))
    return 0 if result["verdict"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
