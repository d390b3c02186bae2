"""/metrics exposition: vLLM names and types, valid Prometheus text format 0.0.4."""
import math
import re

import pytest

from pdctl.lab.engine.metrics import EngineMetrics

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*")*)?\})? '
                    r'(-?[0-9.e+-]+|\+Inf|-Inf|NaN)$')


def parse(text):
    """Check text-format rules; return {family: type} and [(name, labels, value)]."""
    types, samples, seen_families = {}, [], []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            assert name not in types, f"duplicate TYPE for {name}"
            types[name] = kind
            seen_families.append(name)
            continue
        m = SAMPLE.match(line)
        assert m, f"bad sample line: {line!r}"
        name, labels = m.group(1), dict(re.findall(r'([a-zA-Z_]\w*)="([^"]*)"', m.group(3) or ""))
        family = re.sub(r"_(bucket|count|sum)$", "", name)
        assert family in types or name in types, f"sample before its TYPE: {line}"
        # samples of one family are contiguous: they belong to the last TYPE line
        assert seen_families[-1] in (family, name), f"{name} not grouped under its TYPE"
        samples.append((name, labels, float(m.group(5).replace("+Inf", "inf"))))
    return types, samples


def make():
    m = EngineMetrics("glm", dp_size=2, spec_decode=True, kv_connector=True)
    key = m.key(1)
    m.ttft.observe(key, 0.3)
    m.ttft.observe(key, 7000.0)
    m.itl.observe(key, 0.03)
    m.prompt_tokens.inc(key, 2000)
    m.request_success.inc(key + ("length",))
    m.nixl_xfer_time.observe(key, 0.004)
    m.nixl_bytes.observe(key, 2_048_000)
    m.nixl_failed.inc(key)
    m.running.set(key, 3)
    return m


def test_names_and_types():
    types, _ = parse(make().render())
    for name in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:request_time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_queue_time_seconds", "vllm:nixl_xfer_time_seconds", "vllm:nixl_bytes_transferred"):
        assert types[name] == "histogram", name
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert types[name] == "gauge", name
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:spec_decode_num_drafts_total",
                 "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
                 "vllm:nixl_num_failed_transfers_total", "vllm:nixl_num_kv_expired_reqs_total",
                 "vllm:request_success_total"):
        assert types[name] == "counter", name


def test_labels_and_histogram_rules():
    _, samples = parse(make().render())
    for name, labels, _ in samples:
        if name.startswith("vllm:"):
            assert labels["model_name"] == "glm" and labels["engine"] in ("0", "1"), (name, labels)
    buckets = [(l["le"], v) for n, l, v in samples
               if n == "vllm:time_to_first_token_seconds_bucket" and l["engine"] == "1"]
    bounds = [math.inf if le == "+Inf" else float(le) for le, _ in buckets]
    assert bounds == sorted(bounds) and bounds[-1] == math.inf and bounds[0] == 0.001 and bounds[-2] == 2560.0
    values = [v for _, v in buckets]
    assert values == sorted(values) and values[-1] == 2  # cumulative; 7000 s only in +Inf
    count = [v for n, l, v in samples if n == "vllm:time_to_first_token_seconds_count" and l["engine"] == "1"]
    total = [v for n, l, v in samples if n == "vllm:time_to_first_token_seconds_sum" and l["engine"] == "1"]
    assert count == [2] and total == [7000.3]
    itl = [float(l["le"]) for n, l, _ in samples if n == "vllm:inter_token_latency_seconds_bucket"
           and l["engine"] == "0" and l["le"] != "+Inf"]
    assert itl[0] == 0.01 and itl[-1] == 80.0
    success = {l["finished_reason"] for n, l, _ in samples if n == "vllm:request_success_total"}
    assert {"stop", "length", "abort", "error"} <= success


def test_series_exist_before_traffic():
    _, samples = parse(EngineMetrics("m", 4, False, False).render())
    engines = {l["engine"] for n, l, _ in samples if n == "vllm:num_requests_running"}
    assert engines == {"0", "1", "2", "3"}
    assert not any(n.startswith("vllm:spec_decode") or n.startswith("vllm:nixl") for n, _, _ in samples)
    # -dp 4 and no --api-server-count: one API server per DP rank in vLLM 0.33, /metrics on the multiprocess
    # registry, which has no process_* series.
    assert not any(n.startswith("process_") for n, _, _ in samples)


@pytest.mark.parametrize("dp, api_servers, process_series", [(1, None, True), (4, 1, True), (4, None, False),
                                                             (8, 8, False), (2, None, False)])
def test_process_series_only_with_one_api_server(dp, api_servers, process_series):
    types, samples = parse(EngineMetrics("m", dp, False, False, api_servers=api_servers).render())
    rss = [v for n, _, v in samples if n == "process_resident_memory_bytes"]
    assert bool(rss) == process_series and ("process_start_time_seconds" in types) == process_series
    if process_series:
        assert types["process_resident_memory_bytes"] == "gauge" and rss[0] > 1e6
