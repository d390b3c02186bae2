"""Issue 5, acceptance 4: each fault of the stand-in's profile, lease expiry and SIGTERM drain."""
import http.client
import json
import os
import signal
import socket
import threading
import time

import pytest

from pdctl.lab import loopback as ce
from pdctl.lab import tokenizer

pytestmark = pytest.mark.slow

FAST = {"prefill_tokens_per_s": 200000, "prefill_overhead_ms": 5, "decode_step_ms": 10,
        "kv_bytes_per_token": 1024}
PRODUCER = ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_producer",'
            '"kv_connector_extra_config":{"kv_lease_duration":1}}', "-dp", "2"]
CONSUMER = ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}', "-dp", "2"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tokenizer.build(tmp_path_factory.mktemp("faults") / "model")


def chat(model, **extra):
    return {"model": str(model), "messages": [{"role": "user", "content": "lorem ipsum dolor " * 50}],
            "max_tokens": 8, **extra}


def prefill_leg(producer, model):
    status, text = ce.http_post(producer.url + "/v1/chat/completions",
                                chat(model, max_tokens=1, kv_transfer_params={"do_remote_decode": True}))
    assert status == 200, text
    return json.loads(text)["kv_transfer_params"]


def counter(proc, name):
    return sum(ce.metric_values(proc.metrics(), name))


def test_crash_after_requests(model, tmp_path):
    prof = ce.write_profile(tmp_path / "p.yaml", latency=FAST, faults={"crash_after_requests": 3})
    eng = ce.start_engine(model, [], prof, tmp_path, "crash")
    for _ in range(3):
        assert ce.http_post(eng.url + "/v1/chat/completions", chat(model))[0] == 200
    eng.p.wait(5)
    assert eng.p.returncode not in (0, None)
    eng.stop()


def test_refused_side_channel_fails_decode(model, tmp_path):
    prof = ce.write_profile(tmp_path / "p.yaml", latency=FAST, faults={"refuse_side_channel": True})
    producer = ce.start_engine(model, PRODUCER, prof, tmp_path, "p")
    consumer = ce.start_engine(model, CONSUMER, prof, tmp_path, "d")
    try:
        params = prefill_leg(producer, model)
        status, text = ce.http_post(consumer.url + "/v1/chat/completions", chat(model, kv_transfer_params=params))
        assert status == 500
        assert json.loads(text)["error"] == {"message": "Internal server error", "type": "InternalServerError",
                                             "param": None, "code": 500}
        params = prefill_leg(producer, model)  # streamed: 200, then an error event, then [DONE]
        status, text = ce.http_post(consumer.url + "/v1/chat/completions",
                                    chat(model, stream=True, kv_transfer_params=params))
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert status == 200 and json.loads(events[0])["error"]["code"] == 500 and events[-1] == "[DONE]"
        assert counter(consumer, "vllm:nixl_num_failed_transfers_total") == 2
        # a consumer without kv_transfer_params prefills the prompt itself (vLLM's NixlConnector does)
        assert ce.http_post(consumer.url + "/v1/chat/completions", chat(model))[0] == 200
    finally:
        producer.stop()
        consumer.stop()


def test_expired_lease_fails_decode(model, tmp_path):
    prof = ce.write_profile(tmp_path / "p.yaml", latency=FAST)
    producer = ce.start_engine(model, PRODUCER, prof, tmp_path, "p")
    consumer = ce.start_engine(model, CONSUMER, prof, tmp_path, "d")
    try:
        ok = prefill_leg(producer, model)
        assert ce.http_post(consumer.url + "/v1/chat/completions", chat(model, kv_transfer_params=ok))[0] == 200
        late = prefill_leg(producer, model)
        time.sleep(1.8)  # kv_lease_duration is 1 s
        assert ce.http_post(consumer.url + "/v1/chat/completions", chat(model, kv_transfer_params=late))[0] == 500
        assert counter(producer, "vllm:nixl_num_kv_expired_reqs_total") == 1
        assert counter(consumer, "vllm:nixl_num_failed_transfers_total") == 1
        assert counter(consumer, "vllm:nixl_xfer_time_seconds_count") == 1
        assert counter(consumer, "vllm:nixl_bytes_transferred_sum") > 100 * 1024  # ~150 tokens x 1 KiB
    finally:
        producer.stop()
        consumer.stop()


def _cores_anon_bytes(eng):
    """RssAnon summed over the stand-in's engine-core processes (its API server's children)."""
    children = open("/proc/%d/task/%d/children" % (eng.p.pid, eng.p.pid)).read().split()
    total = 0
    for pid in children:
        status = open("/proc/%s/status" % pid).read()
        total += int(next(line.split()[1] for line in status.splitlines() if line.startswith("RssAnon:"))) * 1024
    return len(children), total


def _api_rss(eng):
    return ce.metric_values(eng.metrics(), "process_resident_memory_bytes")[0]


def test_leak_rss_grows_the_engine_cores_not_the_api_server(model, tmp_path):
    """The recipe's leak was in the engine cores: the stand-in's leak faults grow them, so vLLM's
    process_resident_memory_bytes (the API server's, exported with one API server only) does not show it."""
    prof = ce.write_profile(tmp_path / "p.yaml", latency=FAST, faults={"leak_rss_mb_per_min": 600})
    eng = ce.start_engine(model, ["-dp", "2", "--api-server-count", "1"], prof, tmp_path, "leak")
    try:
        api_before, (cores, before) = _api_rss(eng), _cores_anon_bytes(eng)
        time.sleep(4.5)
        api_after, (_, after) = _api_rss(eng), _cores_anon_bytes(eng)
        assert cores == 2
        assert after - before > 25 * 2**20  # 10 MiB/s over both cores for ~4 s
        assert api_after - api_before < 5 * 2**20
    finally:
        eng.stop()


def test_leak_per_request_grows_the_serving_ranks_engine_core(model, tmp_path):
    prof = ce.write_profile(tmp_path / "p.yaml", latency=FAST, faults={"leak_rss_mb_per_request": 2})
    eng = ce.start_engine(model, ["-dp", "2", "--api-server-count", "1"], prof, tmp_path, "leak")
    try:
        api_before, (_, before) = _api_rss(eng), _cores_anon_bytes(eng)
        for _ in range(20):
            assert ce.http_post(eng.url + "/v1/chat/completions", chat(model))[0] == 200
        time.sleep(0.5)
        api_after, (_, after) = _api_rss(eng), _cores_anon_bytes(eng)
        assert 38 * 2**20 < after - before < 44 * 2**20  # 2 MiB per finished request
        assert api_after - api_before < 5 * 2**20
    finally:
        eng.stop()


def test_slow_start_refuses_connections(model, tmp_path):
    prof = ce.write_profile(tmp_path / "p.yaml", latency=FAST, faults={"slow_start_s": 3})
    eng = ce.start_engine(model, [], prof, tmp_path, "slow", wait=False)
    try:
        time.sleep(1.0)
        port = int(eng.url.rsplit(":", 1)[1])
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        t0 = time.time()
        eng.wait_ready(timeout=10)
        assert time.time() - t0 > 1.0
    finally:
        eng.stop()


def test_sigterm_drains_then_exits_zero(model, tmp_path):
    prof = ce.write_profile(tmp_path / "p.yaml", latency={**FAST, "decode_step_ms": 100})
    eng = ce.start_engine(model, ["--shutdown-timeout", "30"], prof, tmp_path, "drain")
    result = {}

    def long_request():
        result["in_flight"] = ce.http_post(eng.url + "/v1/chat/completions",
                                           chat(model, max_tokens=30, ignore_eos=True))

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(0.5)
    eng.p.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    # As vLLM 0.33: the HTTP server still takes requests; its engine core rejects work added during the
    # shutdown, which the client sees as HTTP 200 with finish_reason "abort" and no tokens.
    status, text = ce.http_post(eng.url + "/v1/chat/completions", chat(model))
    assert status == 200 and json.loads(text)["choices"][0]["finish_reason"] == "abort"
    assert json.loads(text)["usage"]["completion_tokens"] == 0
    assert ce.http_get(eng.url + "/health")[0] == 200  # /health does not report draining
    t.join(20)
    assert result["in_flight"][0] == 200
    assert json.loads(result["in_flight"][1])["usage"]["completion_tokens"] == 30
    assert eng.p.wait(10) == 0
    eng.stop()


# ---------------------------------------------------------------- issue 13 item 4: engine processes

def engine_cores(pid):
    """Child processes of the stand-in's API server (its engine cores)."""
    with open("/proc/%d/task/%d/children" % (pid, pid)) as fh:
        return [int(c) for c in fh.read().split()]


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _stream_in_background(eng, model, result, key):
    def run():
        try:
            result[key] = ce.http_post(eng.url + "/v1/chat/completions",
                                       chat(model, max_tokens=30, ignore_eos=True, stream=True))
        except (OSError, http.client.HTTPException) as exc:  # the stream was cut off
            result[key] = (None, repr(exc))
    t = threading.Thread(target=run)
    t.start()
    return t


def test_engine_runs_one_core_process_per_dp_rank(model, tmp_path):
    prof = ce.write_profile(tmp_path / "p.yaml", latency=FAST)
    eng = ce.start_engine(model, ["-dp", "3"], prof, tmp_path, "cores")
    try:
        time.sleep(0.5)
        assert len(engine_cores(eng.p.pid)) == 3
    finally:
        eng.stop()


def _sigterm_during_streams(model, tmp_path, name, signalled):
    """Three streams in flight on a DP2 stand-in, then SIGTERM to signalled(api server pid, core pids);
    asserts every stream completed and the server and its cores exited cleanly."""
    prof = ce.write_profile(tmp_path / "p.yaml", latency={**FAST, "decode_step_ms": 100})
    eng = ce.start_engine(model, ["--shutdown-timeout", "30", "-dp", "2"], prof, tmp_path, name)
    time.sleep(0.5)
    cores = engine_cores(eng.p.pid)
    result = {}
    threads = [_stream_in_background(eng, model, result, i) for i in range(3)]
    time.sleep(0.8)
    for pid in signalled(eng.p.pid, cores):
        os.kill(pid, signal.SIGTERM)
    for t in threads:
        t.join(20)
    assert len(result) == 3
    for status, text in result.values():
        assert status == 200 and text.rstrip().endswith("data: [DONE]"), text[-300:]
        assert text.count('"finish_reason": "length"') == 1
    assert eng.p.wait(10) == 0
    assert not any(_alive(pid) for pid in cores)
    eng.stop()


def test_sigterm_to_every_process_still_completes_streams_in_flight(model, tmp_path):
    """systemd's default KillMode=control-group: as in vLLM 0.33 (EngineCore turns SIGTERM into a drain),
    the engine cores finish their requests before they exit; the streams in flight complete."""
    _sigterm_during_streams(model, tmp_path, "cgroup", lambda server, cores: [server] + cores)


def test_sigterm_to_an_engine_core_alone_drains_its_rank_then_the_server_stops(model, tmp_path):
    """vLLM 0.33's EngineCore on SIGTERM: its requests finish, new ones end with finish_reason "abort", then
    the core exits; an engine core gone while its API server is not stopping ends the server (exit 1)."""
    prof = ce.write_profile(tmp_path / "p.yaml", latency={**FAST, "decode_step_ms": 100})
    eng = ce.start_engine(model, ["--shutdown-timeout", "30"], prof, tmp_path, "core-term")
    time.sleep(0.5)
    (core,) = engine_cores(eng.p.pid)
    result = {}
    thread = _stream_in_background(eng, model, result, 0)
    time.sleep(0.8)
    os.kill(core, signal.SIGTERM)
    time.sleep(0.3)
    status, text = ce.http_post(eng.url + "/v1/chat/completions", chat(model))
    assert status == 200 and json.loads(text)["choices"][0]["finish_reason"] == "abort"
    thread.join(20)
    status, text = result[0]
    assert status == 200 and text.rstrip().endswith("data: [DONE]") and text.count('"finish_reason": "length"') == 1
    assert eng.p.wait(15) == 1
    eng.stop()


def test_sigterm_to_the_api_server_only_completes_streams_then_stops_the_cores(model, tmp_path):
    """KillMode=mixed: SIGTERM reaches the main process only; it drains, then stops its cores."""
    _sigterm_during_streams(model, tmp_path, "mixed", lambda server, cores: [server])
