"""KV-cache path check: a real NIXL (UCX backend) transfer, its bandwidth, latency and the UCX
transports UCX actually chose. The vLLM NixlConnector moves KV blocks the same way.

One file, runnable on its own, because kv_path_check runs it under the serving venv's interpreter
(where nixl and torch live) rather than Ansible's:

    python kvpath.py loopback  [--mem DRAM|VRAM|auto] [--size-mb 256]
    python kvpath.py listener  --bind 0.0.0.0 --port 5655 [--mem ...]   # target side
    python kvpath.py initiator --peer decode-0 --port 5655 [--op READ|WRITE]

Importing it needs the standard library only (parsing and judging); nixl/numpy/torch are imported
by the transfer functions. UCX_PROTO_INFO=y makes UCX print its protocol selection tables (which
transport serves which operation and size): that is how the transports are found.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import re
import socket
import statistics
import sys
import time

RESULT_MARK = "PDCTL_KVPATH_RESULT "
# UCX transports that are RDMA (InfiniBand/RoCE verbs, mlx5 accelerated, AWS EFA).
RDMA_TRANSPORTS = {"rc_mlx5", "rc_verbs", "dc_mlx5", "ud_mlx5", "ud_verbs", "rc", "dc", "ud", "gga_mlx5", "srd"}
LATENCY_BYTES = 4096
PATTERN = 251  # a prime period, so a shifted or partial copy never compares equal


# ------------------------------------------------------------------ UCX_PROTO_INFO parsing

_PREFIX = re.compile(r"^\[[^\]]*\]\s*\[([^\]]*)\]\s?")
_TRANSPORT = re.compile(r"\b([a-z][a-z0-9_]*)/([A-Za-z0-9_.:\-]+)")
_SIZE = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(text):
    text = text.strip()
    if text == "inf":
        return float("inf")
    match = re.match(r"^(\d+)([KMGT]?)B?$", text)
    return int(match.group(1)) * _SIZE[match.group(2)] if match else None


def parse_range(text):
    """'8K..inf' -> (8192, inf); '0' -> (0, 0)."""
    lo, dummy, hi = text.strip().partition("..")
    return _size(lo), _size(hi) if hi else _size(lo)


def parse_proto_info(text):
    """Parse UCX_PROTO_INFO=y tables into [{worker, scope, operation, rows: [{range, description, config,
    transports}]}]. Lines of different threads are kept apart by the UCX log prefix."""
    blocks, current = [], {}
    for raw in text.splitlines():
        match = _PREFIX.match(raw)
        if not match:
            continue
        thread, line = match.group(1), raw[match.end():].strip()
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        block = current.get(thread)
        if len(cells) == 1 and "cfg#" in cells[0]:
            words = cells[0].split()
            block = {"worker": words[0], "scope": " ".join(words[1:-1]), "operation": None, "rows": []}
            current[thread] = block
            blocks.append(block)
        elif block is None:
            continue
        elif len(cells) == 1 and block["operation"] is None:
            block["operation"] = cells[0]
        elif len(cells) >= 3 and cells[0] != "Range":
            config = " ".join(cells[2:])
            block["rows"].append({"range": parse_range(cells[0]), "description": cells[1], "config": config,
                                  "transports": ["/".join(t) for t in _TRANSPORT.findall(config)]})
    return blocks


def transports_used(blocks, worker, op, nbytes):
    """Transports `worker` uses for a NIXL READ (ucp_get) or WRITE (ucp_put) of nbytes to a peer."""
    verb = "remote memory read" if op == "READ" else "remote memory write"
    found = []
    for block in blocks:
        # UCX cuts long worker names in its table headers: the agent name starts with what it prints.
        if not (worker or "").startswith(block["worker"]) or block["scope"] == "self" \
                or not (block["operation"] or "").startswith(verb):
            continue
        for row in block["rows"]:
            lo, hi = row["range"]
            if lo is not None and hi is not None and lo <= nbytes <= hi:
                found += [t for t in row["transports"] if t not in found]
    return found


def transport_kinds(transports):
    return sorted({t.split("/")[0] for t in transports})


# ------------------------------------------------------------------ judging

def judge(result, min_gbps, expect_rdma, where):
    """Failure messages for a transfer result; `where` names the path ('host-a -> host-b')."""
    failures = []
    if not result.get("data_ok"):
        failures.append(f"{where}: transferred data did not match ({result.get('error') or 'corrupt copy'})")
    gbps = result.get("bandwidth_gbps")
    if gbps is not None and gbps < min_gbps:
        failures.append(f"{where}: NIXL {result.get('op')} {result.get('mem')} bandwidth {gbps:.2f} GB/s, expected at "
                        f"least {min_gbps} GB/s (UCX transports: {', '.join(result.get('transports') or ['unknown'])})")
    if expect_rdma:
        kinds = set(transport_kinds(result.get("transports") or []))
        if not kinds:
            failures.append(f"{where}: could not tell which UCX transport carried the data, expected RDMA "
                            "(no UCX_PROTO_INFO tables in the output)")
        elif "tcp" in kinds or not kinds & RDMA_TRANSPORTS:
            failures.append(f"{where}: UCX chose {', '.join(result['transports'])} for the KV transfer, "
                            f"expected RDMA ({', '.join(sorted(RDMA_TRANSPORTS & {'rc_mlx5', 'dc_mlx5', 'rc_verbs'}))})")
    return failures


# ------------------------------------------------------------------ transfers (need nixl)

def _nixl():
    try:
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError:
        from nixl_cu13._api import nixl_agent, nixl_agent_config
    return nixl_agent, nixl_agent_config


def _resolve_mem(mem, gpu):
    if mem != "auto":
        return mem
    try:
        import torch
        return "VRAM" if torch.cuda.is_available() and torch.cuda.device_count() > gpu else "DRAM"
    except ImportError:
        return "DRAM"


class Buffer:
    """A registered-able buffer in DRAM (numpy) or VRAM (torch), with the test pattern or zeros."""

    def __init__(self, mem, nbytes, gpu, fill):
        self.mem, self.nbytes, self.gpu = mem, nbytes, gpu
        if mem == "VRAM":
            import torch
            dev = torch.device(f"cuda:{gpu}")
            if fill:
                base = torch.arange(PATTERN, dtype=torch.uint8, device=dev)
                self.data = base.repeat(nbytes // PATTERN + 1)[:nbytes].contiguous()
            else:
                self.data = torch.zeros(nbytes, dtype=torch.uint8, device=dev)
            self.addr, self.dev = self.data.data_ptr(), gpu
        else:
            import numpy as np
            if fill:
                self.data = np.tile(np.arange(PATTERN, dtype=np.uint8), nbytes // PATTERN + 1)[:nbytes].copy()
            else:
                self.data = np.zeros(nbytes, dtype=np.uint8)
            self.addr, self.dev = self.data.ctypes.data, 0

    def region(self, nbytes=None):
        return (self.addr, nbytes or self.nbytes, self.dev)

    def zero(self):
        if self.mem == "VRAM":
            self.data.zero_()
            import torch
            torch.cuda.synchronize(self.gpu)
        else:
            self.data[:] = 0

    def matches_pattern(self):
        expected = Buffer(self.mem, self.nbytes, self.gpu, fill=True).data
        if self.mem == "VRAM":
            import torch
            return bool(torch.equal(self.data, expected))
        import numpy as np
        return bool(np.array_equal(self.data, expected))


def _agent(name, mem, buf):
    nixl_agent, nixl_agent_config = _nixl()
    agent = nixl_agent(name, nixl_agent_config(backends=["UCX"]))
    agent.register_memory([(buf.addr, buf.nbytes, buf.dev, "")], mem)
    return agent


def _post_and_wait(agent, handle, timeout):
    start = time.perf_counter()
    state = agent.transfer(handle)
    while state not in ("DONE", "ERR"):
        if time.perf_counter() - start > timeout:
            return "TIMEOUT", time.perf_counter() - start
        state = agent.check_xfer_state(handle)
    return state, time.perf_counter() - start


def _drive(agent, local, peer, remote_region, mem, op, nbytes, iterations, timeout):
    """Run the timed transfers from `agent` against `peer`; return measurements."""
    local_descs = agent.get_xfer_descs([local.region()], mem)
    remote_descs = agent.get_xfer_descs([remote_region], mem)
    handle = agent.initialize_xfer(op, local_descs, remote_descs, peer, b"pdctl-kv")
    times = []
    for i in range(iterations + 1):  # the first one pays for connection set-up and is not counted
        state, elapsed = _post_and_wait(agent, handle, timeout)
        if state != "DONE":
            agent.release_xfer_handle(handle)
            return {"state": state, "error": f"transfer {i} ended {state}"}
        if i:
            times.append(elapsed)
    agent.release_xfer_handle(handle)
    # Latency: a small transfer (one KV block is tens of KiB) posted repeatedly.
    small_local = agent.get_xfer_descs([local.region(LATENCY_BYTES)], mem)
    small_remote = agent.get_xfer_descs([(remote_region[0], LATENCY_BYTES, remote_region[2])], mem)
    small = agent.initialize_xfer(op, small_local, small_remote, peer, b"pdctl-kv-lat")
    lat = []
    for dummy in range(21):
        state, elapsed = _post_and_wait(agent, small, timeout)
        if state == "DONE":
            lat.append(elapsed)
    agent.release_xfer_handle(small)
    median = statistics.median(times)
    return {"state": "DONE", "seconds": [round(t, 6) for t in times],
            "bandwidth_gbps": round(nbytes / median / 1e9, 3),
            "best_gbps": round(nbytes / min(times) / 1e9, 3),
            "latency_us": round(statistics.median(lat) * 1e6, 1) if lat else None}


def _base_result(role, mem, op, nbytes, iterations):
    return {"role": role, "mem": mem, "op": op, "size_bytes": nbytes, "iterations": iterations,
            "host": socket.gethostname(), "ucx_env": {k: v for k, v in os.environ.items() if k.startswith("UCX_")}}


def run_loopback(mem="auto", size_mb=256, op="READ", iterations=5, gpu=0, peer_gpu=None, timeout=60.0):
    """Two agents in one process: the initiator pulls from (READ) or pushes to (WRITE) the target."""
    mem = _resolve_mem(mem, gpu)
    nbytes = size_mb << 20
    tag = f"{socket.gethostname()}-{os.getpid()}"
    names = (f"pdctl-kv-target-{tag}", f"pdctl-kv-initiator-{tag}")
    target_buf = Buffer(mem, nbytes, peer_gpu if peer_gpu is not None else gpu, fill=(op == "READ"))
    local_buf = Buffer(mem, nbytes, gpu, fill=(op == "WRITE"))
    target = _agent(names[0], mem, target_buf)
    initiator = _agent(names[1], mem, local_buf)
    initiator.add_remote_agent(target.get_agent_metadata())
    result = _base_result("loopback", mem, op, nbytes, iterations)
    result.update(agent=names[1], peer=names[0])
    result.update(_drive(initiator, local_buf, names[0], target_buf.region(), mem, op, nbytes, iterations, timeout))
    result["data_ok"] = result["state"] == "DONE" and (local_buf if op == "READ" else target_buf).matches_pattern()
    return result


def _send(sock, obj):
    sock.sendall((json.dumps(obj) + "\n").encode())


def _recv(reader):
    line = reader.readline()
    if not line:
        raise ConnectionError("peer closed the control connection")
    return json.loads(line)


def run_listener(bind, port, mem="auto", size_mb=256, gpu=0, timeout=120.0):
    """Target side: register a buffer, hand its NIXL metadata to one initiator over TCP, serve
    the transfers (UCX is one-sided: nothing to do meanwhile), verify WRITEs, return the outcome."""
    mem = _resolve_mem(mem, gpu)
    nbytes = size_mb << 20
    name = f"pdctl-kv-target-{socket.gethostname()}-{os.getpid()}"
    buf = Buffer(mem, nbytes, gpu, fill=True)
    agent = _agent(name, mem, buf)
    result = _base_result("listener", mem, None, nbytes, None)
    server = socket.create_server((bind, port), reuse_port=False)
    server.settimeout(timeout)
    try:
        conn, addr = server.accept()
    except socket.timeout:
        result.update(data_ok=False, error=f"no initiator connected to {bind}:{port} within {timeout:.0f} s")
        return result
    finally:
        server.close()
    conn.settimeout(timeout)
    with conn, conn.makefile("r") as reader:
        _send(conn, {"agent": name, "metadata": base64.b64encode(agent.get_agent_metadata()).decode(),
                     "addr": buf.addr, "dev": buf.dev, "nbytes": nbytes, "mem": mem})
        while True:
            msg = _recv(reader)
            if msg.get("prepare_write"):
                buf.zero()  # so a WRITE must really land to pass verification
                _send(conn, {"ready": True})
            elif msg.get("verify"):
                _send(conn, {"verified": buf.matches_pattern()})
            elif "done" in msg:
                result.update(msg["done"])
                result.update(role="listener", initiator_address=addr[0])
                _send(conn, {"bye": True})
                return result


def run_initiator(peer, port, mem="auto", op="READ", iterations=5, gpu=0, timeout=120.0):
    """Initiator side: fetch the target's metadata, then READ (pull, as vLLM's decode does) or
    WRITE (push) its buffer over NIXL; the target verifies WRITEs."""
    mem = _resolve_mem(mem, gpu)
    deadline = time.time() + timeout
    while True:  # the listener may still be starting
        try:
            conn = socket.create_connection((peer, port), timeout=10)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)
    conn.settimeout(timeout)
    with conn, conn.makefile("r") as reader:
        hello = _recv(reader)
        if hello["mem"] != mem:
            mem_note = f"listener buffer is {hello['mem']}, initiator {mem}"
        else:
            mem_note = None
        nbytes = hello["nbytes"]
        name = f"pdctl-kv-initiator-{socket.gethostname()}-{os.getpid()}"
        local = Buffer(mem, nbytes, gpu, fill=(op == "WRITE"))
        agent = _agent(name, mem, local)
        peer_name = agent.add_remote_agent(base64.b64decode(hello["metadata"]))
        peer_name = peer_name.decode() if isinstance(peer_name, bytes) else peer_name
        if op == "WRITE":
            _send(conn, {"prepare_write": True})
            _recv(reader)
        result = _base_result("initiator", mem, op, nbytes, iterations)
        result.update(agent=name, peer=peer_name, peer_address=peer, peer_mem=hello["mem"])
        try:
            result.update(_drive(agent, local, peer_name, (hello["addr"], nbytes, hello["dev"]), hello["mem"]
                                 if mem == hello["mem"] else mem, op, nbytes, iterations, timeout))
        except Exception as exc:  # reported to both sides rather than leaving the listener waiting
            result.update(state="ERR", error=f"{type(exc).__name__}: {exc}")
        if result["state"] == "DONE" and op == "WRITE":
            _send(conn, {"verify": True})
            result["data_ok"] = bool(_recv(reader)["verified"])
        else:
            result["data_ok"] = result["state"] == "DONE" and local.matches_pattern()
        if mem_note:
            result["note"] = mem_note
        _send(conn, {"done": {k: v for k, v in result.items() if k not in ("ucx_env", "host", "role")}})
        _recv(reader)
    return result


# ------------------------------------------------------------------ command line

def main(argv=None):
    parser = argparse.ArgumentParser(description="NIXL KV-path check (pdctl)")
    parser.add_argument("role", choices=["loopback", "listener", "initiator"])
    parser.add_argument("--mem", default="auto", choices=["auto", "DRAM", "VRAM"])
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--op", default="READ", choices=["READ", "WRITE"])
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--peer-gpu", type=int, default=None, help="loopback: target buffer on another GPU")
    parser.add_argument("--peer", help="initiator: the listener's host name or address")
    parser.add_argument("--bind", default="0.0.0.0")
    parser.add_argument("--port", type=int, help="listener and initiator: the listener's control port")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--min-gbps", type=float, default=None, help="exit 1 below this bandwidth")
    parser.add_argument("--expect-rdma", action="store_true")
    parser.add_argument("--result-file", help="write the JSON result here instead of stdout")
    args = parser.parse_args(argv)
    try:
        if args.role == "loopback":
            result = run_loopback(args.mem, args.size_mb, args.op, args.iterations, args.gpu, args.peer_gpu,
                                  args.timeout)
        elif args.port is None:
            parser.error("%s needs --port" % args.role)
        elif args.role == "listener":
            result = run_listener(args.bind, args.port, args.mem, args.size_mb, args.gpu, args.timeout)
        else:
            if not args.peer:
                parser.error("initiator needs --peer")
            result = run_initiator(args.peer, args.port, args.mem, args.op, args.iterations, args.gpu, args.timeout)
    except Exception as exc:
        result = {"role": args.role, "data_ok": False, "state": "ERR", "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.flush()
    payload = json.dumps(result)
    if args.result_file:
        with open(args.result_file, "w", encoding="utf-8") as handle:
            handle.write(payload)
    else:
        sys.stdout.write(RESULT_MARK + payload + "\n")
        sys.stdout.flush()
    if args.min_gbps is not None and args.role != "listener":
        out = sys.stderr if not args.result_file else sys.stdout
        where = f"{result.get('host')} -> {args.peer or 'loopback'}"
        for failure in judge(result, args.min_gbps, args.expect_rdma, where):
            out.write("FAIL " + failure + "\n")
            return 1
    return 0 if result.get("data_ok", True) or args.role == "listener" else 1


if __name__ == "__main__":
    raise SystemExit(main())
