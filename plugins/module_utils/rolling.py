# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a rolling change reads and drives: HAProxy's runtime API and a vLLM instance's load.

- HAProxy (the front door): `show stat` (CSV; the columns this code reads are named, never indexed:
  `status` for health, `scur` for sessions, `qcur` for the queue, `slim` for a server's maxconn),
  `show servers state BACKEND` (its `srv_admin_state` bits are the admin state: `status` is no guide to
  it, a drained server whose checks fail reads DOWN there like a ready one), `set server BACKEND/SERVER
  state ready|drain|maint`, and process-wide variables (`get var proc.NAME`; `set var` needs the
  connection's experimental mode on 2.6).
- vLLM: `vllm:num_requests_running` + `vllm:num_requests_waiting`, summed over every engine (DP
  rank) of the instance's /metrics, is what it still has in hand.
"""
from __future__ import annotations

import csv
import io
import json
import socket

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import outcome

STATES = ("ready", "drain", "maint")
# srv_admin_state bits (HAProxy's enum srv_admin): SRV_ADMF_MAINT = forced, inherited or DNS-resolution
# maintenance; SRV_ADMF_DRAIN = forced or inherited drain. CMAINT (0x04, `disabled` in the configuration)
# stays set after `state ready` and means nothing alone.
ADMF_MAINT = 0x23
ADMF_DRAIN = 0x18
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
        chunks = []
        try:
            sock.sendall(command.encode() + b"\n")
            while True:
                data = sock.recv(65536)
                if not data:
                    return b"".join(chunks).decode(errors="replace")
                chunks.append(data)
        except OSError as exc:  # a timeout included
            raise RollingError("HAProxy's runtime socket %s did not answer `%s`: %s" % (path, command, exc))


def haproxy_do(path, command):
    """Send a runtime-API command that answers nothing when it works (blank lines only); RollingError
    with HAProxy's answer otherwise (e.g. "No such server.")."""
    answer = haproxy_ask(path, command).strip()
    if answer:
        raise RollingError("HAProxy refused `%s`: %s" % (command, answer))


def haproxy_get_var(path, name):
    """The value of the process-wide variable name (`proc.X`) as text, or None where the running
    configuration never set it. HAProxy 2.6 answers `proc.X: type=sint value=<128>`."""
    answer = haproxy_ask(path, "get var %s" % name).strip()
    if answer.startswith("Variable not found"):
        return None
    prefix = "%s: type=" % name
    if not answer.startswith(prefix) or " value=<" not in answer or not answer.endswith(">"):
        raise RollingError("HAProxy's `get var %s` answered %r" % (name, answer[:200]))
    return answer.split(" value=<", 1)[1][:-1]


def haproxy_set_var(path, name, expression):
    """Set the process-wide variable name to a sample expression (e.g. `int(32)`). On 2.6 `set var` is an
    experimental CLI command: the mode is turned on for this one connection only."""
    haproxy_do(path, "experimental-mode on; set var %s %s" % (name, expression))


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


def parse_servers_state(text):
    """`show servers state BACKEND` -> list of row dicts: a format-version line, a `# ` header naming the
    columns, one space-separated line per server."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2 or not lines[1].startswith("# "):
        raise RollingError("HAProxy's `show servers state` answered without its header: %r" % text[:200])
    names = lines[1][2:].split()
    return [dict(zip(names, line.split())) for line in lines[2:]]


def admin_state(srv_admin_state):
    """ready, drain or maint, from a server's srv_admin_state (`show servers state`)."""
    try:
        bits = int(srv_admin_state)
    except (TypeError, ValueError):
        raise RollingError("unreadable srv_admin_state: %r" % (srv_admin_state,))
    if bits & ADMF_MAINT:
        return "maint"
    if bits & ADMF_DRAIN:
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
            # NAME[{LABELS}] VALUE [TIMESTAMP]: a label value may hold spaces, never past the closing brace
            try:
                rest = line[line.rindex("}") + 1:] if "{" in line else line[len(name):]
                totals[name] = totals.get(name, 0.0) + float(rest.split()[0])
            except (IndexError, ValueError):
                raise RollingError("unreadable metric line: %r" % line[:200])
    if not totals:
        raise RollingError("no %s on the page: not a vLLM instance's /metrics" % " or ".join(IN_FLIGHT_METRICS))
    return totals


def canary_verdict(answer, expect="", max_tokens=None):
    """Whether a started instance's canary answer lets a router send it traffic. answer: the JSON of its
    /v1/completions reply (a short completion at temperature 0); expect: the answer it gave the same request on its
    previous configuration ('' when there is none to compare with); max_tokens: the request's. Greedy decoding of
    the same prompt on the same weights gives the same tokens, so a configuration that changes them is caught here.
    The answer is judged by the one outcome rule (outcome.of_response: finish_reason, the usage's token count of
    the length asked), then it must not be empty and must match expect.

    Returns {"ok", "text", "finish_reason", "tokens", "msg": why it is refused ('' when ok)}."""
    choices = (answer or {}).get("choices") or [{}]
    first = choices[0] if isinstance(choices[0], dict) else {}
    text, finish = str(first.get("text") or ""), first.get("finish_reason")
    tokens = ((answer or {}).get("usage") or {}).get("completion_tokens")
    kind = outcome.of_response(200, answer if isinstance(answer, dict) else {}, max_tokens)
    ok = kind is None and bool(text) and expect in ("", text)
    msg = ""
    if not ok:
        msg = "answers the canary %s (finish_reason %s, %s of %s tokens%s)" % (
            json.dumps(text), finish or "none", tokens, max_tokens, ": " + kind if kind else "")
        if expect:
            msg += ", on its previous configuration %s" % json.dumps(expect)
    return {"ok": ok, "text": text, "finish_reason": finish, "tokens": tokens, "msg": msg}
