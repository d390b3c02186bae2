"""Soak gate logic without a deployment: the slope fit, the verdict and the report."""
from __future__ import annotations

import json
import random

import pytest

from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import report, soak


def _samples(mb_per_request, n=40, noise_mb=0.0, seed=1):
    rnd = random.Random(seed)
    out = []
    for k in range(n):
        finished = 25.0 * k
        rss = (500 + mb_per_request * finished + rnd.gauss(0, noise_mb)) * 2**20
        out.append({"t": float(k), "instances": {"decode-0": {"rss_bytes": rss, "finished": finished}}})
    return out


def _requests(latency=lambda t: 0.2, n=400, duration=40.0):
    return [{"t": duration * k / n, "latency_s": latency(duration * k / n), "ok": True} for k in range(n)]


def _evaluate(samples, requests, **cfg):
    cfg = soak.settings(dict({"duration_s": 40, "warmup_s": 4}, **cfg))
    return soak.evaluate("http://r", "m", cfg, [{"name": "decode-0", "url": "http://d"}], samples, requests, 40.0)


def test_linear_fit_recovers_a_known_slope_with_its_interval():
    xs = [float(x) for x in range(20)]
    fit = soak.linear_fit(xs, [3 + 2 * x + (0.1 if x % 2 else -0.1) for x in xs])
    assert fit["slope"] == pytest.approx(2.0, abs=0.01)
    assert fit["ci95"][0] < 2.0 < fit["ci95"][1] and fit["ci95"][1] - fit["ci95"][0] < 0.05
    assert soak.linear_fit([1.0, 2.0], [1.0, 2.0])["slope"] is None


def test_a_leak_fails_naming_the_instance_and_its_slope():
    result = _evaluate(_samples(0.5, noise_mb=2), _requests())
    assert not result["passed"]
    inst = result["instances"]["decode-0"]
    assert inst["rss_slope_mb_per_1k"] == pytest.approx(500, rel=0.02)
    assert inst["rss_slope_ci95"][0] > 20
    assert any(f.startswith("decode-0: RSS grows 5") and "per 1,000 requests" in f for f in result["failures"])


def test_noise_without_a_trend_passes():
    result = _evaluate(_samples(0.0, noise_mb=5), _requests())
    assert result["passed"], result["failures"]
    lo, hi = result["instances"]["decode-0"]["rss_slope_ci95"]
    assert lo < 0 < hi or abs(result["instances"]["decode-0"]["rss_slope_mb_per_1k"]) < 20


def test_a_small_but_certain_slope_under_the_limit_passes():
    result = _evaluate(_samples(0.01), _requests(), max_rss_slope_mb_per_1k=20)
    assert result["passed"]
    assert result["instances"]["decode-0"]["rss_slope_mb_per_1k"] == pytest.approx(10, rel=0.01)


def test_latency_drift_fails_and_steady_latency_does_not():
    drifting = _evaluate(_samples(0.0), _requests(lambda t: 0.2 * (1 + t / 20) + 0.001 * (t % 3)))
    assert any(f.startswith("latency drift") for f in drifting["failures"])
    steady = _evaluate(_samples(0.0), _requests(lambda t: 0.2 + 0.01 * ((t * 7) % 3)))
    assert steady["passed"] and abs(steady["latency_drift"]["relative"]) < 0.05


def test_failed_requests_fail_the_gate():
    reqs = _requests()
    reqs[50]["ok"] = False
    result = _evaluate(_samples(0.0), reqs)
    assert "1 of 400 requests failed" in result["failures"]


def test_settings_are_checked():
    with pytest.raises(soak.SoakError):
        soak.settings({"duraton_s": 10})
    with pytest.raises(soak.SoakError):
        soak.settings({"duration_s": 10, "warmup_s": 20})


def test_report_writes_json_markdown_and_plot(tmp_path):
    result = _evaluate(_samples(0.5), _requests())
    files = report.write_soak(tmp_path, result)
    assert json.loads((tmp_path / "soak.json").read_text())["passed"] is False
    md = (tmp_path / "soak.md").read_text()
    assert "# Soak gate: FAILED" in md and "| decode-0 |" in md
    assert (tmp_path / "soak.png").read_bytes()[:4] == b"\x89PNG" and files["plot"].endswith("soak.png")
