#!/usr/bin/env python3
"""Where the playbook time of a test run goes: each task's wall time, summed over ansible-runner runs.

    .venv/bin/python benchmarks/task_wall.py [DIR ...] [--top N]

DIR is an ansible-runner private data directory; the default is every $TMPDIR/pdctl-runner-* (pdctl.runner
keeps one per playbook run, so after `scripts/test -m lab` they hold the lab phase). A task's wall time is
from its start event to the next task's start in the same run: retries and waits count, and the first
task of a run carries the connection setup. Prints the total and the top tasks with their run counts.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import tempfile
from datetime import datetime


def task_starts(events_dir: str) -> list[tuple[datetime, str]]:
    """(time, task name) of each task start in one run's job_events, in order."""
    starts = []
    for path in glob.glob(os.path.join(events_dir, "*.json")):
        with open(path, encoding="utf-8") as fh:
            try:
                event = json.load(fh)
            except ValueError:
                continue  # a run killed mid-write
        if event.get("event") == "playbook_on_task_start":
            starts.append((datetime.fromisoformat(event["created"]), event["event_data"].get("task", "?")))
    return sorted(starts)


def task_wall(run_dirs: list[str]) -> tuple[collections.Counter, collections.Counter, int]:
    """(seconds per task name, runs per task name, number of runs read)."""
    seconds, count, runs = collections.Counter(), collections.Counter(), 0
    for run_dir in run_dirs:
        for events_dir in glob.glob(os.path.join(run_dir, "artifacts", "*", "job_events")):
            runs += 1
            starts = task_starts(events_dir)
            for (t0, name), (t1, _) in zip(starts, starts[1:]):
                seconds[name] += (t1 - t0).total_seconds()
                count[name] += 1
    return seconds, count, runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", help="ansible-runner private data directories")
    parser.add_argument("--top", type=int, default=40, help="tasks to print (default 40)")
    args = parser.parse_args(argv)
    dirs = args.dirs or sorted(glob.glob(os.path.join(tempfile.gettempdir(), "pdctl-runner-*")))
    seconds, count, runs = task_wall(dirs)
    if not runs:
        parser.error("no ansible-runner events under %s" % (" ".join(dirs) or "$TMPDIR/pdctl-runner-*"))
    print("%d runs, %.0f s of task wall time (the last task of each run is not counted)" % (runs, sum(seconds.values())))
    for name, secs in seconds.most_common(args.top):
        print("%7.1f s %4d  %s" % (secs, count[name], name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
