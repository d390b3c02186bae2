# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a rolling change reads and drives: HAProxy's runtime API and a vLLM instance's load.

- HAProxy (the front door): `show stat` (CSV; the columns this code reads are named, never indexed)
  and `set server BACKEND/SERVER state ready|drain|maint`. A server's admin state reads from its
  `status` column: MAINT (also "MAINT (via ...)"), DRAIN, or anything else (UP, DOWN, NOLB, "UP 1/2")
  meaning ready.
- vLLM: `vllm:num_requests_running` + `vllm:num_requests_waiting`, summed over every engine (DP
  rank) of the instance's /metrics, is what it still has in hand.
"""
from __future__ import annotations

import csv
import io
import socket

STATES = ("ready", "drain", "maint")
IN_FLIGHT_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")


class RollingError(RuntimeError):
    pass


# ---------------------------------------------------------------- HAProxy runtime API

def haproxy_ask(path, command, timeout=10.0):
    """Send one runtime-API command over the UNIX socket at path; return the answer text."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as exc:
            raise RollingError("cannot reach HAProxy's runtime socket %s: %s (is the front door running on "
                               "this host?)" % (path, exc))
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            data = sock.recv(65536)
            if not data:
                return b"".join(chunks).decode(errors="replace")
            chunks.append(data)


def parse_stat(text):
    """`show stat` CSV -> list of row dicts keyed by the header's column names."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# "):
        raise RollingError("HAProxy's `show stat` answered without its header: %r" % text[:200])
    reader = csv.DictReader(io.StringIO("\n".join([lines[0][2:]] + lines[1:])))
    return [row for row in reader if row.get("pxname")]


def server_row(rows, backend, server):
    for row in rows:
        if row["pxname"] == backend and row["svname"] == server:
            return row
    known = sorted("%s/%s" % (r["pxname"], r["svname"]) for r in rows
                   if r["svname"] not in ("FRONTEND", "BACKEND"))
    raise RollingError("HAProxy has no server %s/%s (servers: %s)" % (backend, server, ", ".join(known) or "none"))


def admin_state(status):
    """ready, drain or maint, from a `show stat` status."""
    status = (status or "").upper()
    if status.startswith("MAINT"):
        return "maint"
    if status.startswith("DRAIN"):
        return "drain"
    return "ready"


def is_up(status):
    """Health checks pass (a draining server that is healthy reads DRAIN)."""
    status = (status or "").upper()
    return (status.startswith("UP") and "/" not in status) or status == "DRAIN" or status == "NO CHECK"


# ---------------------------------------------------------------- vLLM load

def in_flight(metrics_text):
    """{metric: sum over engines} for the in-flight metrics of a Prometheus text page.

    Raises RollingError when the page has neither (not a vLLM instance, or not its /metrics)."""
    totals = {}
    for line in metrics_text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in IN_FLIGHT_METRICS:
            try:
                totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                raise RollingError("unreadable metric line: %r" % line[:200])
    if not totals:
        raise RollingError("no %s on the page: not a vLLM instance's /metrics" % " or ".join(IN_FLIGHT_METRICS))
    return totals
