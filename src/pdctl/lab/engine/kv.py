"""The simulated NIXL KV hand-off: a producer's side channel (one TCP listener per DP rank on
VLLM_NIXL_SIDE_CHANNEL_PORT + rank) serving leased "KV" as real bytes, and the consumer's pull.

Wire format (ours; NIXL's own is not reproduced): the consumer sends one JSON line
{"remote_request_id", "remote_engine_id", "compat"}; the producer answers one JSON line
{"ok": true, "nbytes": N} followed by N bytes, or {"ok": false, "error": "..."}.
"""
from __future__ import annotations

import asyncio
import json
import time

CHUNK = memoryview(bytes(1 << 20))


class KVPullError(Exception):
    pass


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


async def serve_side_channel(host: str, port: int, leases: Leases, compat: str):
    async def handle(reader, writer):
        try:
            line = await reader.readline()
            req = json.loads(line)
            if req.get("compat") != compat:
                reply, lease = {"ok": False, "error": "handshake compatibility hash mismatch"}, None
            else:
                lease = leases.take(req.get("remote_request_id", ""), req.get("remote_engine_id", ""))
                reply = ({"ok": True, "nbytes": lease[1]} if lease else
                         {"ok": False, "error": "unknown or expired remote_request_id"})
            writer.write(json.dumps(reply).encode() + b"\n")
            if lease:
                left = lease[1]
                while left > 0:
                    n = min(left, len(CHUNK))
                    writer.write(CHUNK[:n])
                    left -= n
                    await writer.drain()
            await writer.drain()
        except (ConnectionError, json.JSONDecodeError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, reuse_address=True)


async def pull(host: str, port: int, remote_request_id: str, remote_engine_id: str, compat: str,
               timeout_s: float = 30.0) -> int:
    """Read the request's KV from the producer; returns the byte count or raises KVPullError."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, asyncio.TimeoutError) as exc:
        raise KVPullError(f"NIXL handshake with {host}:{port} failed: {exc}") from None
    try:
        writer.write(json.dumps({"remote_request_id": remote_request_id,
                                 "remote_engine_id": remote_engine_id, "compat": compat}).encode() + b"\n")
        await writer.drain()
        reply = json.loads(await asyncio.wait_for(reader.readline(), timeout_s) or b"{}")
        if not reply.get("ok"):
            raise KVPullError(f"KV transfer from {host}:{port} failed: {reply.get('error', 'no reply')}")
        left = nbytes = int(reply["nbytes"])
        while left > 0:
            chunk = await asyncio.wait_for(reader.read(min(left, 1 << 20)), timeout_s)
            if not chunk:
                raise KVPullError(f"KV transfer from {host}:{port} truncated")
            left -= len(chunk)
        return nbytes
    except (OSError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
        raise KVPullError(f"KV transfer from {host}:{port} failed: {exc!r}") from None
    finally:
        writer.close()
