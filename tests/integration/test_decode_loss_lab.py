"""Decode loss on the lab (issue 39): the front door goes to degraded mode (the prefill instances serve whole
requests through the aggregated router) instead of failing, and back to P/D by itself; its own /health says
503 only when nothing can serve.

The decode kill here is benchmarks/faults.py's decode-kill, shortened (the fault 4 s in, 3 s of load after
P/D is back): the same figures and the same acceptance as the benchmark's JSON line."""
import time

import httpx
import pytest

from pdctl.lab import faults
from test_serving import CA, FRONTDOOR, INSTANCES, client_key, on_host

pytestmark = [pytest.mark.lab, pytest.mark.slow]

PREFILL = {h: names for h, names in INSTANCES.items() if h != "lab-decode-0"}


def _health():
    return httpx.get(FRONTDOOR + "/health", verify=CA, timeout=5)


def _complete():
    body = {"model": "/mnt/model/glm/GLM-5.2-NVFP4", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 8, "ignore_eos": True}
    return httpx.post(FRONTDOOR + "/v1/chat/completions", json=body, verify=CA, timeout=60,
                      headers={"Authorization": "Bearer " + client_key()})


def _until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.25)


def _units(action, hosts):
    for host, names in hosts.items():
        on_host(host, "systemctl", action, *("pdctl-vllm-%s.service" % n for n in names))


def test_decode_kill_degrades_and_returns_to_pd_by_itself(converged_lab):
    result = faults.run("decode-kill", fault_at_s=4, tail_s=3)
    print(result)
    assert result["requests"] >= 40, result
    # The streams in flight on the dead decode are lost (counted); nothing else.
    assert result["failed_requests"] <= result["in_flight_at_fault"], result
    assert result["failed_started_after_grace"] == 0, result
    assert result["degraded_s"] > 0, result
    assert result["back_to_pd_s"] is not None, result
    assert result["prefill_restarts"] == 0, result
    assert not result["prefill_down_alert"], result


def test_frontdoor_health_is_503_only_when_nothing_can_serve(converged_lab):
    # The mode of the front door this test asks (FRONTDOOR: lab-decode-0's); the other one checks the same
    # routers on its own clock, up to a check interval apart.
    sampler = faults.ModeSampler("lab-decode-0")
    sampler.start()
    try:
        _until(lambda: sampler.mode() == "pd", 30, "the front door is not in P/D mode to begin with")
        assert _health().status_code == 200
        # No decode: degraded, still serving, and /health says so.
        _units("stop", {"lab-decode-0": INSTANCES["lab-decode-0"]})
        _until(lambda: sampler.mode() == "aggregated", 15, "no aggregated mode without the decode")
        assert _health().status_code == 200
        answer = _complete()
        assert answer.status_code == 200 and answer.json()["choices"][0]["finish_reason"] == "length", answer.text
        # No prefill either: nothing can serve.
        _units("stop", PREFILL)
        _until(lambda: sampler.mode() == "down", 15, "routers still up without any prefill instance")
        health = _health()
        assert health.status_code == 503 and health.headers.get("Retry-After"), health.text
        assert _complete().status_code == 503
    finally:
        _units("start", PREFILL)
        _units("start", {"lab-decode-0": INSTANCES["lab-decode-0"]})
    try:
        _until(lambda: sampler.mode() == "pd", 120, "the front door did not return to P/D")
    finally:
        sampler.stop()
    assert _health().status_code == 200
    assert _complete().status_code == 200


def test_degraded_alert_fires_on_the_lab_prometheus_while_degraded(converged_lab):
    """PdctlDegradedMode fires on the lab's Prometheus (the first router host's) while no decode can serve, and
    PdctlPrefillDown does not (the prefill pool serves)."""
    from pdctl import inventory
    from inventories import ROOT

    plan = inventory.plan(ROOT / "inventories/lab")
    alerts = faults.AlertWatcher("http://%s:9090" % plan["routers"][0]["address"])
    sampler = faults.ModeSampler()
    sampler.start()
    alerts.start()
    try:
        _until(lambda: sampler.mode() == "pd", 30, "the front door is not in P/D mode to begin with")
        _units("stop", {"lab-decode-0": INSTANCES["lab-decode-0"]})
        stopped = time.time()
        _until(lambda: "PdctlDegradedMode" in alerts.firing, 90, "PdctlDegradedMode never fired: %s" % alerts.errors)
        print("PdctlDegradedMode firing %.1f s after the decode stopped" % (alerts.firing["PdctlDegradedMode"] - stopped))
        assert sampler.mode() == "aggregated"
        assert "PdctlPrefillDown" not in alerts.firing
    finally:
        _units("start", {"lab-decode-0": INSTANCES["lab-decode-0"]})
        alerts.stop()
    try:
        _until(lambda: sampler.mode() == "pd", 120, "the front door did not return to P/D")
    finally:
        sampler.stop()
