"""Issue 5, acceptance 2: 1,000 streamed chat requests through the real vllm-router in P/D mode
(two producers, one consumer, loopback) complete without failures; the consumer counts the pulls."""
import pytest

from pdctl.lab import loopback as ce
from pdctl.lab import tokenizer, tools

pytestmark = pytest.mark.slow

FAST = {"prefill_tokens_per_s": 200000, "prefill_overhead_ms": 5, "decode_step_ms": 10,
        "decode_step_ms_per_request": 0.01, "kv_bytes_per_token": 1024}


def test_thousand_streamed_requests_through_router(tmp_path):
    model = tokenizer.build(tmp_path / "model")
    prof = ce.write_profile(tmp_path / "p.yaml", latency=FAST)
    procs = [ce.start_engine(model, ce.PREFILL_ARGS, prof, tmp_path, f"prefill{i}") for i in range(2)]
    procs.append(ce.start_engine(model, ce.DECODE_ARGS, prof, tmp_path, "decode"))
    router = ce.start_router(tools.ensure_vllm_router(), procs[:2], procs[2:], tmp_path)
    try:
        res = ce.bench(tools.ensure_vllm_rs(), router.url, model, tmp_path, "load", backend="openai-chat",
                       concurrency=64, num_prompts=1000, input_len=256, output_len=16)
        assert res["completed"] == 1000 and res["failed"] == 0
        decode = procs[2].metrics()
        assert sum(ce.metric_values(decode, "vllm:nixl_xfer_time_seconds_count")) == 1000
        assert sum(ce.metric_values(decode, "vllm:nixl_num_failed_transfers_total")) == 0
        assert sum(ce.metric_values(decode, "vllm:nixl_bytes_transferred_sum")) >= 1000 * 256 * 1024
        prefill_legs = sum(sum(ce.metric_values(p.metrics(), "vllm:request_success_total")) for p in procs[:2])
        assert prefill_legs == 1000
        assert sum(ce.metric_values(decode, "vllm:spec_decode_num_drafts_total")) > 0
    finally:
        router.stop()
        for p in procs:
            p.stop()


def test_stream_load_through_the_router_sees_every_token(tmp_path):
    """The one outcome rule needs each stream's token count: the usage chunk the load generator asks for
    (stream_options.include_usage) reaches it through the real vllm-router in P/D mode; every request is ok
    with exactly max_tokens tokens."""
    import time

    from pdctl.lab.load import StreamLoad

    model = tokenizer.build(tmp_path / "model")
    prof = ce.write_profile(tmp_path / "p.yaml", latency=FAST)
    procs = [ce.start_engine(model, ce.PREFILL_ARGS, prof, tmp_path, "prefill"),
             ce.start_engine(model, ce.DECODE_ARGS, prof, tmp_path, "decode")]
    router = ce.start_router(tools.ensure_vllm_router(), procs[:1], procs[1:], tmp_path)
    try:
        with StreamLoad(router.url, "unused", clients=4, model=str(model)) as load:
            time.sleep(4)
        summary = load.summary()
        assert summary["requests"] >= 8 and summary["failed_requests"] == 0, summary
        assert {(o.finish_reason, o.tokens) for o in load.outcomes} == {("length", 24)}
    finally:
        router.stop()
        for p in procs:
            p.stop()
