"""What a playbook killed like an operator's `kill -9` of its process group leaves running: Mitogen's connection
multiplexers start sessions of their own, so they outlive the group (seen: five idle `ansible-playbook` processes
30+ minutes after a benchmark's kills). The benchmarks kill playbooks on purpose, many times a run; they note the
playbook's descendants before the kill and end those left afterwards, so a CI machine does not collect them."""
from __future__ import annotations

import collections
import os
import signal
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every process below pid (children, theirs, ...), from /proc, whatever session or group it is in."""
    children = collections.defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name (field 2) may hold spaces and parentheses: the parent pid follows the last ")".
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # ended while listed
        children[ppid].append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def end(pids) -> list[int]:
    """SIGKILL those of pids still running; the ones it ended."""
    ended = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            ended.append(pid)
        except ProcessLookupError:
            pass
    return ended
