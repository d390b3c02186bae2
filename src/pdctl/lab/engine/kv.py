"""The simulated NIXL KV hand-off: a producer's side channel (one TCP listener per DP rank on
VLLM_NIXL_SIDE_CHANNEL_PORT + rank) serving leased "KV" as real bytes, and the consumer's pull.

Wire format (ours; NIXL's own is not reproduced): the consumer sends one JSON line
{"remote_request_id", "remote_engine_id", "compat", "release"}; the producer answers one JSON line
{"ok": true, "nbytes": N} followed by N bytes, or {"ok": false, "error": "..."}; a refused
handshake (compatibility hash mismatch, as vLLM's enforce_handshake_compat) also names the
producer's release, {"ok": false, "compat_mismatch": true, "release": {...}}, so the consumer can
say which two releases met. "release" is {"name", "version", "vllm_version"} of a stand-in release.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time

CHUNK = memoryview(bytes(1 << 20))


class KVPullError(Exception):
    """A failed pull. compat_mismatch: the producer refused the handshake (another release);
    remote_release: the producer's release identity when it said; unreachable: no answer came (connect
    refused/reset/timed out, or the connection broke mid-transfer), unlike a reply that refused."""

    def __init__(self, message: str, compat_mismatch: bool = False, remote_release: dict | None = None,
                 unreachable: bool = False):
        super().__init__(message)
        self.compat_mismatch, self.remote_release = compat_mismatch, remote_release
        self.unreachable = unreachable


def compat_hash(vllm_version: str, model: str, speculative_method: str) -> str:
    """The stand-in's NIXL compatibility hash: what differs between releases or models refuses the
    handshake (vLLM's covers more factors: KV dtype, attention backend, connector version...)."""
    return hashlib.sha256(f"{vllm_version}|{model}|{speculative_method}".encode()).hexdigest()[:16]


def release_summary(release: dict | None) -> dict | None:
    """The part of a RELEASE dict that travels on the side channel."""
    if not release:
        return None
    return {k: release.get(k) for k in ("name", "version", "vllm_version")}


class Leases:
    """KV held on the producer for kv_lease_duration seconds after the prefill finished."""

    def __init__(self, duration_s: float, on_expired):
        self.duration_s = duration_s
        self.on_expired = on_expired  # callback(rank)
        self.held: dict[str, tuple[float, int, int, str]] = {}  # id -> (expiry, nbytes, rank, engine)

    def add(self, request_id: str, nbytes: int, rank: int, engine_id: str) -> float:
        expiry = time.monotonic() + self.duration_s
        self.held[request_id] = (expiry, nbytes, rank, engine_id)
        return expiry

    def take(self, request_id: str, engine_id: str):
        self.reap()
        lease = self.held.get(request_id)
        if lease is None:
            return None
        if lease[3] != engine_id:
            return None
        del self.held[request_id]
        return lease

    def reap(self) -> None:
        now = time.monotonic()
        for rid, (expiry, _, rank, _) in list(self.held.items()):
            if expiry <= now:
                del self.held[rid]
                self.on_expired(rank)


async def _recv_line(loop, conn, limit=65536) -> tuple[bytes, bytes]:
    """Read up to the first newline; returns (line, bytes received after it)."""
    data = b""
    while b"\n" not in data:
        chunk = await loop.sock_recv(conn, 65536)
        if not chunk or len(data) > limit:
            raise ConnectionError("side channel closed before a full line")
        data += chunk
    line, _, rest = data.partition(b"\n")
    return line, rest


_RESOLVED: dict[tuple[str, int], tuple[str, int]] = {}


async def _resolve(loop, host: str, port: int):
    """IPv4 address of host (cached; getaddrinfo runs in a worker thread)."""
    try:
        socket.inet_aton(host)
        return (host, port)
    except OSError:
        pass
    if (host, port) not in _RESOLVED:
        infos = await loop.getaddrinfo(host, port, family=socket.AF_INET, type=socket.SOCK_STREAM)
        _RESOLVED[(host, port)] = infos[0][4]
    return _RESOLVED[(host, port)]


class SideChannel:
    """One producer listener (plain non-blocking sockets: sock_sendall from a shared zero buffer
    keeps a multi-MB "KV" transfer cheap for the event loop)."""

    def __init__(self, sock: socket.socket, task: asyncio.Task):
        self.sock, self.task = sock, task

    def close(self) -> None:
        self.task.cancel()
        self.sock.close()


async def serve_side_channel(host: str, port: int, leases: Leases, compat: str,
                             release: dict | None = None) -> SideChannel:
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(await _resolve(loop, host, port))
    sock.listen(512)
    sock.setblocking(False)

    async def handle(conn: socket.socket) -> None:
        try:
            line, _ = await _recv_line(loop, conn)
            req = json.loads(line)
            lease = None
            if req.get("compat") != compat:
                reply = {"ok": False, "error": "handshake compatibility hash mismatch", "compat_mismatch": True,
                         "release": release_summary(release)}
            else:
                lease = leases.take(req.get("remote_request_id", ""), req.get("remote_engine_id", ""))
                reply = ({"ok": True, "nbytes": lease[1]} if lease else
                         {"ok": False, "error": "unknown or expired remote_request_id"})
            await loop.sock_sendall(conn, json.dumps(reply).encode() + b"\n")
            left = lease[1] if lease else 0
            while left > 0:
                n = min(left, len(CHUNK))
                await loop.sock_sendall(conn, CHUNK[:n])
                left -= n
        except (OSError, ValueError):
            pass
        finally:
            conn.close()

    async def accept_loop() -> None:
        while True:
            conn, _ = await loop.sock_accept(sock)
            conn.setblocking(False)
            loop.create_task(handle(conn))

    return SideChannel(sock, loop.create_task(accept_loop()))


async def pull(host: str, port: int, remote_request_id: str, remote_engine_id: str, compat: str,
               timeout_s: float = 30.0, release: dict | None = None, dead_peer_timeout_s: float = 0.0) -> int:
    """Read the request's KV from the producer; returns the byte count or raises KVPullError.
    dead_peer_timeout_s: a pull from an unreachable peer fails no sooner than this after it began
    (the profile's faults.dead_peer_timeout_s; NIXL over UCX waits out its timeouts where TCP is refused)."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        return await _pull(loop, host, port, remote_request_id, remote_engine_id, compat, timeout_s, release)
    except KVPullError as exc:
        if exc.unreachable and dead_peer_timeout_s > 0:
            await asyncio.sleep(max(0.0, began + dead_peer_timeout_s - loop.time()))
        raise


async def _pull(loop, host, port, remote_request_id, remote_engine_id, compat, timeout_s, release) -> int:
    conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    conn.setblocking(False)
    try:
        try:
            await asyncio.wait_for(loop.sock_connect(conn, await _resolve(loop, host, port)), timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            raise KVPullError(f"NIXL handshake with {host}:{port} failed: {exc!r}", unreachable=True) from None
        await loop.sock_sendall(conn, json.dumps({"remote_request_id": remote_request_id,
                                                  "remote_engine_id": remote_engine_id,
                                                  "compat": compat,
                                                  "release": release_summary(release)}).encode() + b"\n")
        line, rest = await asyncio.wait_for(_recv_line(loop, conn), timeout_s)
        reply = json.loads(line)
        if not reply.get("ok"):
            raise KVPullError(f"KV transfer from {host}:{port} failed: {reply.get('error', 'no reply')}",
                              bool(reply.get("compat_mismatch")), reply.get("release"))
        nbytes = int(reply["nbytes"])
        got = len(rest)
        buf = bytearray(min(nbytes, 1 << 20) or 1)
        while got < nbytes:
            n = await asyncio.wait_for(loop.sock_recv_into(conn, buf), timeout_s)
            if n == 0:
                raise KVPullError(f"KV transfer from {host}:{port} truncated at {got}/{nbytes} bytes",
                                  unreachable=True)
            got += n
        return nbytes
    except (OSError, asyncio.TimeoutError) as exc:  # reset, closed or silent: the peer went away
        raise KVPullError(f"KV transfer from {host}:{port} failed: {exc!r}", unreachable=True) from None
    except ValueError as exc:  # it answered, but not in our wire format
        raise KVPullError(f"KV transfer from {host}:{port} failed: {exc!r}") from None
    finally:
        conn.close()
