"""Issue 37, dead-peer realism: with the profile's faults.dead_peer_timeout_s, a KV pull from a peer that is
gone fails only after that long (NIXL over UCX waits out its timeouts; TCP on loopback is refused at once).
A peer that answers and refuses (an expired lease, another release) still fails at once."""
import asyncio
import json
import socket
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from pdctl.lab import tokenizer as lab_tokenizer
from pdctl.lab.engine import args as engine_args, kv, profile as engine_profile
from pdctl.lab.engine.cli import load_model_dir
from pdctl.lab.engine.server import Engine, build_app

DEAD_PEER_S = 0.5


def _free_port() -> int:
    """A port nobody listens on: a connect is refused, as from a producer that died."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _timed_failure(**pull_args) -> tuple[kv.KVPullError, float]:
    t0 = time.monotonic()
    with pytest.raises(kv.KVPullError) as failed:
        await kv.pull(**pull_args)
    return failed.value, time.monotonic() - t0


def _pull_args(port, request_id="r1", compat="compat", dead_peer_timeout_s=DEAD_PEER_S) -> dict:
    return {"host": "127.0.0.1", "port": port, "remote_request_id": request_id, "remote_engine_id": "eng",
            "compat": compat, "dead_peer_timeout_s": dead_peer_timeout_s}


def test_a_pull_from_a_closed_port_waits_out_the_dead_peer_timeout():
    async def go():
        slow, slow_s = await _timed_failure(**_pull_args(_free_port()))
        fast, fast_s = await _timed_failure(**_pull_args(_free_port(), dead_peer_timeout_s=0))
        return slow, slow_s, fast, fast_s

    slow, slow_s, fast, fast_s = asyncio.run(go())
    assert slow.unreachable and fast.unreachable and not slow.compat_mismatch
    assert DEAD_PEER_S <= slow_s < 2.0, slow_s
    assert fast_s < 0.2, fast_s  # the lab's default: refused at once


def test_a_transfer_cut_mid_way_is_a_dead_peer_too():
    """The producer answers, sends part of the KV and goes away (a crash mid-transfer)."""
    async def go():
        loop = asyncio.get_running_loop()
        port = _free_port()

        async def half_then_gone(reader, writer):
            await reader.readline()
            writer.write(json.dumps({"ok": True, "nbytes": 1 << 20}).encode() + b"\n" + bytes(4096))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(half_then_gone, "127.0.0.1", port)
        try:
            t0 = loop.time()
            with pytest.raises(kv.KVPullError, match="truncated") as cut:
                await kv.pull(**_pull_args(port))
            return cut.value, loop.time() - t0
        finally:
            server.close()

    cut, took = asyncio.run(go())
    assert cut.unreachable and DEAD_PEER_S <= took < 2.0, took


def test_a_refused_reply_is_not_delayed():
    """An expired lease or a compatibility mismatch is the peer's answer: no timeout to wait out."""
    async def go():
        leases = kv.Leases(30, lambda rank: None)
        port = _free_port()
        chan = await kv.serve_side_channel("127.0.0.1", port, leases, "compat")
        try:
            leases.add("r2", 10, 0, "eng")
            results = [await _timed_failure(**_pull_args(port, dead_peer_timeout_s=5)),  # no such lease
                       await _timed_failure(**_pull_args(port, "r2", "other", dead_peer_timeout_s=5))]
        finally:
            chan.close()
        return results

    (expired, expired_s), (mismatch, mismatch_s) = asyncio.run(go())
    assert "unknown or expired" in str(expired) and not expired.unreachable
    assert mismatch.compat_mismatch and not mismatch.unreachable
    assert expired_s < 0.5 and mismatch_s < 0.5, (expired_s, mismatch_s)


def test_the_profile_key_defaults_to_the_labs_fast_failure():
    assert engine_profile.DEFAULTS["faults"]["dead_peer_timeout_s"] == 0


# ---------------------------------------------------------------- through the decode's HTTP server

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return lab_tokenizer.build(tmp_path_factory.mktemp("model"))


def _decode(model_dir, policy: str, dead_peer_timeout_s: float) -> Engine:
    a = engine_args.parse([str(model_dir), "--kv-transfer-config",
                           json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_consumer",
                                       "kv_load_failure_policy": policy})])
    tok, template, max_len = load_model_dir(a.model, None)
    prof = engine_profile.load("")
    prof["faults"]["dead_peer_timeout_s"] = dead_peer_timeout_s
    return Engine(a, prof, tok, template, max_len)


def _decode_leg(model_dir, policy: str, dead_peer_timeout_s: float) -> tuple[int, dict, float, str]:
    """A decode-leg chat request whose prefill's side channel is gone; returns status, body, seconds, metrics."""
    async def go():
        engine = _decode(model_dir, policy, dead_peer_timeout_s)
        params = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": _free_port(),
                  "remote_request_id": "chatcmpl-gone", "remote_engine_id": "p_dp0"}
        body = {"model": str(model_dir), "messages": [{"role": "user", "content": "lorem ipsum"}],
                "max_tokens": 2, "kv_transfer_params": params}
        async with TestClient(TestServer(build_app(engine))) as client:
            t0 = time.monotonic()
            resp = await client.post("/v1/chat/completions", json=body)
            out = await resp.json()
            took = time.monotonic() - t0
            metrics = await (await client.get("/metrics")).text()
        return resp.status, out, took, metrics

    return asyncio.run(go())


def _failed_transfers(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("vllm:nixl_num_failed_transfers_total{"))


def test_a_decode_with_recompute_answers_only_after_the_dead_peer_timeout(model_dir):
    status, out, took, metrics = _decode_leg(model_dir, "recompute", DEAD_PEER_S)
    assert status == 200 and out["choices"][0]["message"]["content"], out
    assert DEAD_PEER_S <= took < 2.0, took
    assert _failed_transfers(metrics) == 1
    status, _, took, _ = _decode_leg(model_dir, "recompute", 0)
    assert status == 200 and took < DEAD_PEER_S, took  # the lab default: local prefill at once


def test_a_decode_with_fail_answers_500_after_the_dead_peer_timeout(model_dir):
    status, out, took, metrics = _decode_leg(model_dir, "fail", DEAD_PEER_S)
    assert status == 500 and out["error"]["type"] == "InternalServerError", out
    assert DEAD_PEER_S <= took < 2.0, took
    assert _failed_transfers(metrics) == 1
