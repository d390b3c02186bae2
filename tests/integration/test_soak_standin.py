"""The soak gate against a loopback stand-in (no podman): with the stand-in's per-request leak fault it fails
naming the instance and its slope; without it it passes. Both reports carry the RSS plot."""
from __future__ import annotations

import json

import pytest

from pdctl.gates import cli
from pdctl.lab import loopback as lb
from pdctl.lab import tokenizer

pytestmark = [pytest.mark.slow]

SETTINGS = ["--duration", "12", "--warmup", "3", "--sample-interval", "1", "--concurrency", "4",
            "--max-rss-slope", "20"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tokenizer.build(tmp_path_factory.mktemp("soak") / "model")


def _soak(model, tmp_path, faults, capsys):
    profile = tmp_path / "profile.yaml"
    profile.write_text("faults: %s\n" % json.dumps(faults))
    eng = lb.start_engine(model, lb.SINGLE_ARGS, profile, tmp_path, "engine")
    try:
        rc = cli.main(["soak", "--router-url", eng.url, "--instance", "decode-0=" + eng.url,
                       "--artifacts", str(tmp_path / "report"), *SETTINGS])
    finally:
        eng.stop()
    out = capsys.readouterr()
    return rc, json.loads((tmp_path / "report/soak.json").read_text()), out


def test_soak_fails_on_the_leak_fault_naming_instance_and_slope(model, tmp_path, capsys):
    rc, result, out = _soak(model, tmp_path, {"leak_rss_mb_per_request": 0.5}, capsys)
    assert rc == cli.EXIT_FAILED
    inst = result["instances"]["decode-0"]
    assert inst["rss_slope_mb_per_1k"] == pytest.approx(500, rel=0.1)
    assert inst["rss_slope_ci95"][0] > 20
    assert "decode-0: RSS grows" in out.err and "MB per 1,000 requests" in out.err
    assert (tmp_path / "report/soak.png").stat().st_size > 10000


def test_soak_passes_without_the_fault(model, tmp_path, capsys):
    rc, result, out = _soak(model, tmp_path, {}, capsys)
    assert rc == 0, out.err
    inst = result["instances"]["decode-0"]
    assert inst["requests_served"] > 100 and result["requests"]["failed"] == 0
    assert abs(inst["rss_slope_mb_per_1k"]) < 20
    assert (tmp_path / "report/soak.png").stat().st_size > 10000
