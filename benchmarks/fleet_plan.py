#!/usr/bin/env python3
"""How long `pdctl plan` and `pdctl render` take on a fleet of cells (inventories/b300-fleet: 20 cells, 62 hosts),
with inventories/b300 (3 hosts) for reference.

    .venv/bin/python benchmarks/fleet_plan.py [--runs 3] [--skip-render]

Runs each command as an operator does (the `pdctl` beside this interpreter, a fresh process each time) and prints
one JSON line: per inventory and command the median wall time of the runs (and their CPU time: on a shared
controller the wall time also counts the other jobs' load, which the line records), and a verdict against the
limits docs/cells.md states (plan under 1 s, render under 30 s on the fleet).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMITS_S = {"plan": 1.0, "render": 30.0}
INVENTORIES = ("b300-fleet", "b300")


def _pdctl() -> str:
    beside = Path(sys.executable).with_name("pdctl")
    return str(beside) if beside.exists() else "pdctl"


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and its children) of one run; raises when it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit("%s failed (%d): %s" % (" ".join(argv), done.returncode, done.stderr[-2000:]))
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(command: str, inventory: str, runs: int) -> dict:
    walls, cpus = [], []
    for _ in range(runs):
        argv = [_pdctl(), command, "-i", "inventories/%s" % inventory]
        out = None
        if command == "render":
            out = tempfile.mkdtemp(prefix="pdctl-bench-render-")
            argv += ["--out", out]
        try:
            wall, cpu = timed(argv)
        finally:
            if out:
                shutil.rmtree(out, ignore_errors=True)
        walls.append(wall)
        cpus.append(cpu)
    return {"median_s": round(statistics.median(walls), 2), "cpu_median_s": round(statistics.median(cpus), 2),
            "runs_s": [round(w, 2) for w in walls]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per command (default 3; the median is reported)")
    parser.add_argument("--skip-render", action="store_true", help="time `pdctl plan` only")
    args = parser.parse_args(argv)
    commands = ["plan"] + ([] if args.skip_render else ["render"])
    result = {"runs": args.runs, "load_before": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}
    for inventory in INVENTORIES:
        result[inventory] = {command: measure(command, inventory, args.runs) for command in commands}
    result["load_after"] = round(os.getloadavg()[0], 2)
    fleet = result["b300-fleet"]
    result["verdict"] = {command: "%s (%.2f s, limit %.0f s)" % (
        "pass" if fleet[command]["median_s"] < LIMITS_S[command] else "fail", fleet[command]["median_s"],
        LIMITS_S[command]) for command in commands}
    print(json.dumps(result, sort_keys=True))
    return 0 if all(v.startswith("pass") for v in result["verdict"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
