"""Load and capacity on the lab: StreamLoad runs N clients, each streaming chat completions back to
back, every request's outcome recorded (start, end, HTTP status, [DONE], finish_reason, completion tokens)
and judged by the one request-outcome rule (pdctl.outcome: ok, or a failure of kind status / cut / abort /
short); FrontdoorCapacity samples how many prefill instances the front door can reach through its routers."""
from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass, field

import httpx

from pdctl import outcome as rule

MODEL = "/mnt/model/glm/GLM-5.2-NVFP4"


@dataclass
class Outcome:
    start: float
    end: float
    status: int | None
    done: bool
    error: str = ""
    wall_start: float = 0.0  # time.time() at the start, to compare with a host's journal
    finish_reason: str | None = None
    tokens: int | None = None  # completion tokens (the stream's usage chunk)
    max_tokens: int | None = None
    kind: str | None = "unjudged"  # None when ok, else one of pdctl.outcome.KINDS; judged when not given
    ttft: float | None = None  # seconds from the start to the first chunk with generated text

    def __post_init__(self):
        if self.kind == "unjudged":
            self.kind = rule.failure_kind(self.status, self.done, self.finish_reason, self.tokens,
                                          self.max_tokens, bool(self.error))

    @property
    def ok(self) -> bool:
        return self.kind is None


@dataclass
class StreamLoad:
    """Run `clients` streaming clients against url until stop(); outcomes in order of completion."""
    url: str
    key: str
    clients: int = 8
    max_tokens: int = 24
    verify: str | bool = True
    outcomes: list = field(default_factory=list)
    model: str = MODEL
    # Each client's httpx timeout (s, for connect and every read): a stream whose server vanished (a host
    # lost, no FIN nor RST ever comes) fails after this much silence.
    timeout: float = 120

    def __post_init__(self):
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(self.clients)]

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join(180)

    def _client(self, i):
        # ignore_eos: every answer is exactly max_tokens long (finish_reason length); the usage chunk
        # gives the count the rule checks.
        body = {"model": self.model, "messages": [{"role": "user", "content": "client %d: tell me about GPUs." % i}],
                "max_tokens": self.max_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        headers = {"Authorization": "Bearer " + self.key}
        with httpx.Client(timeout=self.timeout, verify=self.verify) as client:
            while not self._stop.is_set():
                t0, wall0, status, error, reader = time.monotonic(), time.time(), None, "", rule.StreamReader()
                ttft = None
                try:
                    with client.stream("POST", self.url + "/v1/chat/completions", json=body, headers=headers) as resp:
                        status = resp.status_code
                        if status != 200:
                            error = resp.read().decode(errors="replace")[:200]
                        else:
                            for line in resp.iter_lines():
                                reader.feed(line)
                                if ttft is None and reader.content:
                                    ttft = time.monotonic() - t0
                except httpx.HTTPError as exc:
                    error = repr(exc)[:200]
                error = error or reader.error
                kind = reader.kind(status, self.max_tokens)  # a connection broken mid-stream: cut
                if kind and not error:
                    error = "%s: finish_reason %s, %s of %d tokens%s" % (
                        kind, reader.finish_reason, reader.tokens, self.max_tokens, "" if reader.done else ", no [DONE]")
                with self._lock:
                    self.outcomes.append(Outcome(t0, time.monotonic(), status, reader.done, error, wall0,
                                                 reader.finish_reason, reader.tokens, self.max_tokens, kind, ttft))

    # -- figures ------------------------------------------------------------------------------
    def failed(self) -> list:
        return [o for o in self.outcomes if not o.ok]

    def summary(self) -> dict:
        """requests, failed_requests, failure_window_s, errors (up to 5 distinct), and failed_by_kind
        ({status, cut, abort, short}: how many failures of each kind)."""
        failed = self.failed()
        return {"requests": len(self.outcomes), "failed_requests": len(failed),
                "failure_window_s": round(max(o.end for o in failed) - min(o.start for o in failed), 2) if failed else 0.0,
                "errors": sorted({o.error or str(o.status) for o in failed})[:5],
                "failed_by_kind": rule.count_kinds(o.kind for o in failed)}


# Python run on the front-door host (python3 -c): ask(cmd) sends one command to HAProxy's runtime socket
# and returns its answer. The probes here and in benchmarks/faults.py start with it.
HAPROXY_ASK = r"""
import json, socket, time
def ask(cmd):
    s = socket.socket(socket.AF_UNIX); s.connect("/run/haproxy/admin.sock"); s.sendall(cmd.encode() + b"\n")
    out = b""
    while True:
        d = s.recv(65536)
        if not d: return out.decode()
        out += d
"""

# Run on the front-door host: the P/D routers the front door sends to (status UP, not draining or in
# maintenance), each one's prefill upstreams (its unit's argv), and which of those answer /health; the
# aggregated routers (degraded mode, docs/decode-loss.md) UP beside them, apart.
_CAPACITY_PROBE = HAPROXY_ASK + r"""
import re, subprocess, urllib.request
lines = ask("show stat").splitlines()
cols = lines[0][2:].split(",")
active, aggregated = [], []
for line in lines[1:]:
    row = dict(zip(cols, line.split(",")))
    if row.get("pxname") == "be_routers" and row["svname"] not in ("FRONTEND", "BACKEND") and row["status"] == "UP":
        (aggregated if row["svname"].endswith("-aggregated") else active).append(row["svname"])
prefill = set()
for server in active:
    unit = "pdctl-router-standby.service" if server.endswith("-standby") else "pdctl-router.service"
    argv = subprocess.run(["systemctl", "show", "-p", "ExecStart", "--value", unit], capture_output=True, text=True).stdout
    prefill |= set(re.findall(r"--prefill (http://[0-9.:]+)", argv))
healthy = []
for url in sorted(prefill):
    try:
        healthy.append(url) if urllib.request.urlopen(url + "/health", timeout=2).status == 200 else None
    except Exception:
        pass
print(json.dumps({"active": active, "prefill": sorted(prefill), "healthy": healthy, "aggregated": aggregated}))
"""


def vip_holder(vip, hosts):
    """Which of the lab's front-door hosts holds the virtual address now (None: none does)."""
    for host in hosts:
        proc = subprocess.run(["podman", "exec", host, "ip", "-o", "addr", "show", "to", vip],
                              capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip():
            return host
    return None


class FrontdoorCapacity(threading.Thread):
    """Every second: how many healthy prefill instances the routers the front door sends to have. With vip (and
    the front-door hosts), the front door read is the one holding that address then (clients reach that one)."""

    def __init__(self, frontdoor_host, vip=None, hosts=()):
        super().__init__(daemon=True)
        self.frontdoor_host, self.vip, self.hosts = frontdoor_host, vip, list(hosts)
        self.samples, self.errors = [], []
        self._halt = threading.Event()

    def sample(self) -> dict:
        """One reading now: {active, prefill, healthy, aggregated}; {} when the probe failed (its error is kept)."""
        host = vip_holder(self.vip, self.hosts) if self.vip else self.frontdoor_host
        if host is None:
            self.errors.append("no front door holds %s" % self.vip)
            return {}
        proc = subprocess.run(["podman", "exec", host, "python3", "-c", _CAPACITY_PROBE],
                              capture_output=True, text=True)
        if proc.returncode:
            self.errors.append(proc.stderr[-300:])
            return {}
        return json.loads(proc.stdout)

    def run(self):
        while not self._halt.is_set():
            reading = self.sample()
            if reading:
                self.samples.append((time.time(), reading))
            self._halt.wait(1.0)

    def stop(self):
        self._halt.set()
        self.join(30)

    def minimum(self):
        return min((len(s["healthy"]) for _, s in self.samples), default=None)
