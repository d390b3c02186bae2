"""An answer that streams longer than the routers' old deadline allowed ends with [DONE] (issue 40).

vllm-router's --request-timeout-secs is a total deadline: a stream still running at it is cut (HTTP 200, no
[DONE]). It used to be a fixed 1800 s in the inventory, which cut every answer over ~90K tokens at the SLA's
20 ms; the router role now derives it from pdctl_router.longest_stream (plugins/filter/deadline.py). A lab
stream cannot run for half an hour, so this test scales the durations down by SCALE through the same
variables production derives the deadline from (the longest answer and the longest prefill divided by
SCALE; the TPOT and the margin as they are), converges the router with them, and streams an answer through
the front door that outlasts the old deadline scaled the same way (1800 / SCALE s): it must end with
[DONE], finish_reason length and every token asked for (pdctl.outcome's rule), served P/D (decode pulled
the KV). Afterwards the router goes back to the lab's own settings."""
import json
import re
import time

import httpx
import pytest
import yaml
from ansible_collections.pdctl.vllm_pd.plugins.filter import deadline

from conftest import LAB_ENV
from inventories import ROOT, inventory_variant, group_var
from pdctl import outcome, runner
from test_serving import CA, FRONTDOOR, MODEL, ROUTER_HOST, client_key, kv_pulls, on_host
from test_two_routers_lab import _frontdoor_servers

pytestmark = [pytest.mark.lab, pytest.mark.slow]

LAB_ROUTER = group_var("lab", "pdctl_router")
# The fixed --request-timeout-secs every inventory carried before the deadline was derived (commit fc16d48).
OLD_DEADLINE_S = 1800
# Production's 1M-token answer becomes 4096 tokens, its 600 s prefill 2.3 s; the old 1800 s becomes 7.0 s.
SCALE = 256
# ~10.4 s at the stand-in's TPOT (~10.2 ms: a 30 ms step, MTP 3 drafts at 0.8 acceptance) after a short
# prefill: half as long again as the old deadline, a tenth of the derived one. In production terms (x SCALE)
# a 262K-token answer, which the old 1800 s would have cut after ~90K tokens.
MAX_TOKENS = 1024


def scaled(longest_stream, scale):
    """The longest stream with its durations divided by scale (the TPOT a token takes and the margin stay)."""
    return dict(longest_stream, max_output_tokens=longest_stream["max_output_tokens"] // scale,
                prefill_s=longest_stream["prefill_s"] / scale)


def _request_timeout(unit):
    argv = on_host(ROUTER_HOST, "systemctl", "show", "-p", "ExecStart", "--value", unit)
    return int(re.search(r"--request-timeout-secs (\d+)", argv).group(1))


def _pd_router_in_rotation():
    return _frontdoor_servers().get(ROUTER_HOST) == "UP"


@pytest.fixture
def scaled_router(converged_lab, tmp_path):
    """The lab's routers with the scaled deadline; back to the lab's own afterwards (also after a failure)."""
    settings = dict(LAB_ROUTER, longest_stream=scaled(LAB_ROUTER["longest_stream"], SCALE))
    inv = inventory_variant(tmp_path / "scaled", {"group_vars/all": {"pdctl_router": settings}})
    try:
        result = runner.run_playbook("site.yml", inv, tags="router", limit=ROUTER_HOST, envvars=LAB_ENV)
        assert result.ok, result.failures
        yield deadline.longest_stream_s(settings["longest_stream"])
    finally:
        restored = runner.run_playbook("site.yml", ROOT / "inventories/lab", tags="router", limit=ROUTER_HOST,
                                       envvars=LAB_ENV)
        assert restored.ok, restored.failures
        assert _request_timeout("pdctl-router.service") == deadline.longest_stream_s(LAB_ROUTER["longest_stream"])


def test_an_answer_longer_than_the_old_deadline_ends_with_done(scaled_router):
    derived_s, old_s = scaled_router, OLD_DEADLINE_S / SCALE
    # The routers run with the deadline the role derived from the scaled variables, and the old fixed value
    # scaled the same way is far shorter: the arithmetic the test relies on.
    assert derived_s == deadline.longest_stream_s(scaled(LAB_ROUTER["longest_stream"], SCALE)) == 169
    for unit in ("pdctl-router.service", "pdctl-router-aggregated.service"):
        assert _request_timeout(unit) == derived_s, unit
    # The restarted P/D router back in the front door's rotation (2 checks, 1 s apart), so the stream goes P/D.
    deadline_at = time.monotonic() + 30
    while not _pd_router_in_rotation():
        assert time.monotonic() < deadline_at, _frontdoor_servers(aggregated=True)
        time.sleep(0.5)

    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a very long story about GPUs."}],
            "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    pulls, reader, chunks, status = kv_pulls(), outcome.StreamReader(), [], None
    started = time.monotonic()
    with httpx.stream("POST", FRONTDOOR + "/v1/chat/completions", json=body, verify=CA, timeout=derived_s,
                      headers={"Authorization": "Bearer " + client_key()}) as resp:
        status = resp.status_code
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                chunks.append(time.monotonic() - started)
            reader.feed(line)
    duration_s = time.monotonic() - started
    print(json.dumps({"test": "long_stream", "scale": SCALE, "old_deadline_s": round(old_s, 2),
                      "derived_deadline_s": derived_s, "duration_s": round(duration_s, 2),
                      "ttft_s": round(chunks[0], 3) if chunks else None, "status": status, "done": reader.done,
                      "finish_reason": reader.finish_reason, "completion_tokens": reader.tokens,
                      "max_tokens": MAX_TOKENS, "chunks": len(chunks),
                      "chunks_before_old_deadline": sum(1 for t in chunks if t < old_s),
                      "outcome": outcome.failure_kind(status, reader.done, reader.finish_reason, reader.tokens,
                                                      MAX_TOKENS, bool(reader.error)) or "ok"}))
    assert reader.kind(status, MAX_TOKENS) is None, (status, reader.done, reader.finish_reason, reader.tokens,
                                                     reader.error)
    assert reader.done and reader.finish_reason == "length" and reader.tokens == MAX_TOKENS
    # It streamed well past where the old deadline would have cut it (a second over it, more than any hop
    # between this client and the router adds), and within the derived one.
    assert old_s + 1 < duration_s < derived_s, duration_s
    assert chunks[-1] > old_s + 1, chunks[-1]
    assert kv_pulls() == pulls + 1, "not served P/D: decode pulled no KV"
