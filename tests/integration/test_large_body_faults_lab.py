"""A prefill instance killed under 64K-token prompts fails no request (issue 40): the bodies (~260 KB) are far
over HAProxy's default 16 KB buffer, which a retry needs whole; vllm-router 0.1.17 does not retry a failed
prefill leg itself, so the front door's buffer holds the largest allowed request and replays it."""
import threading
import time

import httpx
import pytest

from pdctl import outcome as rule
from test_faults_lab import unit_state, wait_restarted
from test_serving import CA, FRONTDOOR, client_key, on_host

pytestmark = [pytest.mark.lab, pytest.mark.slow]

PROMPT_TOKENS = 65536
MAX_TOKENS = 8


def test_prefill_kill_under_64k_token_prompts_fails_no_request(converged_lab):
    body = {"model": "/mnt/model/glm/GLM-5.2-NVFP4", "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "GPU " * PROMPT_TOKENS}]}
    size = len(httpx.Request("POST", FRONTDOOR, json=body).content)
    assert size > 16384 * 8, size  # far over the old buffer
    outcomes, stop, lock = [], threading.Event(), threading.Lock()

    def client():
        with httpx.Client(timeout=120, verify=CA) as c:
            while not stop.is_set():
                t0, reader, status, error = time.monotonic(), rule.StreamReader(), None, ""
                try:
                    with c.stream("POST", FRONTDOOR + "/v1/chat/completions", json=body,
                                  headers={"Authorization": "Bearer " + client_key()}) as resp:
                        status = resp.status_code
                        if status != 200:
                            error = resp.read().decode(errors="replace")[:200]
                        for line in resp.iter_lines():
                            reader.feed(line)
                except httpx.HTTPError as exc:
                    error = repr(exc)[:200]
                with lock:
                    outcomes.append((t0, reader.kind(status, MAX_TOKENS), error or reader.error))

    host, name = "lab-prefill-0", "prefill-0"
    before = unit_state(host, name)
    threads = [threading.Thread(target=client, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        time.sleep(4)
        on_host(host, "kill", "-9", before["MainPID"])
        back_s = wait_restarted(host, name, before["MainPID"])
        time.sleep(4)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    failed = [o for o in outcomes if o[1]]
    print("prefill kill under %d-byte bodies: %d requests, %d failed, back in %.1f s: %s"
          % (size, len(outcomes), len(failed), back_s, [o[1:] for o in failed[:3]]))
    assert int(unit_state(host, name)["NRestarts"]) == int(before["NRestarts"]) + 1
    assert len(outcomes) >= 20, len(outcomes)
    assert not failed, failed[:5]
