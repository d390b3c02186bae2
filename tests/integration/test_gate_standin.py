"""Gates end to end against a local engine on 127.0.0.1: the lab stand-in (python -m pdctl.lab.engine serve).

The SLA tests run the real benchmark client (vllm-rs from the vllm 0.33.0 wheel, pdctl.lab.tools) at small
context and output lengths so they finish in seconds on a 2-core machine.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from pdctl import collection
import yaml

import requires
from pdctl.gates import cli
from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import accuracy, answer_key, sla
from pdctl.lab import tokenizer, tools

ROOT = collection.root()
DATA = ROOT / "tests" / "fixtures" / "gates" / "datasets"

pytestmark = pytest.mark.slow

ACC = {"local_dir": str(DATA), "longbench": {"buckets": {"short": 12, "medium": 12, "long": 12}},
       "concurrency": 16, "time_budget_s": 120}
FAST = {"prefill_tokens_per_s": 200000, "prefill_overhead_ms": 20, "decode_step_ms": 8,
        "decode_step_ms_per_request": 0.5, "mtp_acceptance_rate": 0.0}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    tokenizer.build(d)
    return d


@pytest.fixture
def engine(tmp_path, model_dir):
    """start(profile) -> base URL of an engine running that profile; stopped at teardown."""
    procs = []

    def start(profile: dict) -> str:
        path = tmp_path / ("profile%d.yaml" % len(procs))
        path.write_text(yaml.safe_dump(profile))
        port = _free_port()
        env = dict(os.environ, PDCTL_ENGINE_PROFILE=str(path))
        argv = [sys.executable, "-m", "pdctl.lab.engine", "serve", str(model_dir), "--host", "127.0.0.1",
                "--port", str(port)]
        log_path = tmp_path / ("engine%d.log" % len(procs))
        log = open(log_path, "w")
        procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
        url = "http://127.0.0.1:%d" % port
        for _ in range(150):
            try:
                if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            if procs[-1].poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError("engine did not start: %s" % log_path.read_text()[-2000:])

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def vllm_rs():
    try:
        return str(tools.ensure_vllm_rs())
    except subprocess.CalledProcessError as exc:  # `pip download` of the vllm wheel failed: no cache, no index
        requires.missing("vllm-rs (the vllm %s wheel)" % tools.VLLM_VERSION, "pip download failed: %s" % exc)


def _key(tmp_path, rate):
    path = tmp_path / ("key-%s.json" % rate)
    path.write_text(json.dumps(answer_key.build_from_config(ACC, rate)))
    return str(path)


# --- accuracy ---------------------------------------------------------------------------------------

def test_accuracy_passes_at_90_percent(engine, tmp_path):
    url = engine({"latency": FAST, "answers": {"key": _key(tmp_path, 0.9)}})
    rc = cli.main(["accuracy", "--router-url", url, "--config", _yaml(tmp_path, ACC), "--artifacts",
                   str(tmp_path / "a")])
    data = json.loads((tmp_path / "a" / "accuracy.json").read_text())
    assert rc == 0, data["failures"]
    for name, b in data["benchmarks"].items():
        assert b["parse_rate"] == 1.0 and b["truncation_rate"] == 0.0
        expected = sum(answer_key.predicted_correct(r["prompt_sha256"], 0.9)
                       for r in map(json.loads, (tmp_path / "a" / "accuracy_items.jsonl").read_text().splitlines())
                       if r["benchmark"] == name)
        assert b["correct"] == expected  # graded exactly as the stand-in decided
    for suffix in ("md", "png"):
        assert (tmp_path / "a" / ("accuracy." + suffix)).stat().st_size > 0
    # GPQA by id and hash only
    items = (tmp_path / "a" / "accuracy_items.jsonl").read_text()
    assert "Synthetic item" not in items and "squared" not in items


def test_accuracy_fails_at_20_percent(engine, tmp_path):
    url = engine({"latency": FAST, "answers": {"key": _key(tmp_path, 0.2)}})
    report, _ = accuracy.run(url, ACC)
    assert not report["passed"]
    for name in ("aime", "gpqa", "longbench"):
        assert any(f.startswith(name + ":") and "below the floor" in f for f in report["failures"])
    rc = cli.main(["accuracy", "--router-url", url, "--config", _yaml(tmp_path, ACC), "--benchmarks", "gpqa",
                   "--artifacts", str(tmp_path / "b")])
    assert rc == cli.EXIT_FAILED


def test_accuracy_unparsable_fails_on_parse_rate(engine, tmp_path):
    url = engine({"latency": FAST, "answers": {"key": _key(tmp_path, 0.9), "mode": "unparsable"}})
    report, _ = accuracy.run(url, dict(ACC, benchmarks=["gpqa", "longbench"]))
    assert not report["passed"]
    for name in ("gpqa", "longbench"):
        b = report["benchmarks"][name]
        assert b["parse_rate"] == 0.0
        assert any(c["name"] == "parse_rate" and not c["ok"] for c in b["checks"])
    assert any("gpqa: parse rate 0.0% (64 of 64 unparsable)" in f for f in report["failures"])


def test_accuracy_with_reference_run(engine, tmp_path):
    url = engine({"latency": FAST, "answers": {"key": _key(tmp_path, 0.9)}})
    cfg = dict(ACC, benchmarks=["gpqa"])
    good, _ = accuracy.run(url, cfg, reference={"gpqa": {"correct": 60, "samples": 64}})
    assert good["passed"], good["failures"]
    bad, _ = accuracy.run(url, dict(cfg, gpqa={"floor": 0}), reference={"gpqa": {"correct": 64, "samples": 64}})
    assert not bad["passed"] and "vs reference 64/64" in bad["failures"][0]


# --- SLA --------------------------------------------------------------------------------------------

SLA = {"contexts": [1024, 2048], "output_len": 16, "concurrency": 2, "num_prompts": 8}


def _sla_cfg(vllm_rs, model_dir, **kw):
    return dict(SLA, client=[vllm_rs, "bench", "serve"], tokenizer=str(model_dir), **kw)


@pytest.mark.timing
def test_sla_passes_with_a_fast_profile(engine, tmp_path, vllm_rs, model_dir):
    url = engine({"latency": FAST})
    rc = cli.main(["sla", "--router-url", url, "--vllm-rs", vllm_rs, "--tokenizer", str(model_dir),
                   "--contexts", "1024,2048", "--output-len", "16", "--concurrency", "2", "--num-prompts", "8",
                   "--artifacts", str(tmp_path / "s")])
    data = json.loads((tmp_path / "s" / "sla.json").read_text())
    assert rc == 0, data["failures"]
    assert [r["input_len"] for r in data["runs"]] == [1024, 2048]
    assert all(r["completed"] == 8 and r["failed"] == 0 and r["mean_tpot_ms"] < 20 for r in data["runs"])
    assert (tmp_path / "s" / "sla_context.png").stat().st_size > 0


@pytest.mark.timing
def test_sla_slow_decode_fails_naming_context_and_value(engine, tmp_path, vllm_rs, model_dir):
    url = engine({"latency": dict(FAST, decode_step_ms=35)})
    report = sla.run(url, _sla_cfg(vllm_rs, model_dir), tmp_path / "s")
    assert not report["passed"]
    for run, msg in zip(report["runs"], report["failures"]):
        assert msg.startswith("context %d: mean TPOT %.2f ms > limit 20.00 ms" % (run["input_len"], run["mean_tpot_ms"]))
        assert run["mean_tpot_ms"] > 30


@pytest.mark.timing
def test_sla_capacity_search(engine, tmp_path, vllm_rs, model_dir):
    # TPOT ~ 8 ms + 1.5 ms per other running request: the 20 ms limit is crossed at about 9 concurrent requests
    url = engine({"latency": dict(FAST, decode_step_ms_per_request=1.5)})
    cfg = _sla_cfg(vllm_rs, model_dir, contexts=[1024], capacity={"enabled": True, "start": 1, "max": 32},
                   prompts_per_slot=2)
    report = sla.run(url, cfg, tmp_path / "s")
    cap = report["capacity"]
    assert 4 <= cap["max_concurrency"] <= 12, [(p["concurrency"], p["mean_tpot_ms"]) for p in cap["probes"]]
    passed = {p["concurrency"]: p["passed"] for p in cap["probes"]}
    assert passed[cap["max_concurrency"]] and not passed.get(cap["max_concurrency"] + 1, False)


def test_sla_gate_module_under_ansible(engine, tmp_path, vllm_rs, model_dir):
    """The module as Ansible runs it: ad hoc on localhost with the venv's python."""
    url = engine({"latency": dict(FAST, decode_step_ms=35)})
    args = {"router_url": url, "client": [vllm_rs, "bench", "serve"], "contexts": [1024], "output_len": 16,
            "concurrency": 2, "num_prompts": 8, "tokenizer": str(model_dir), "artifacts_dir": str(tmp_path / "m")}
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-i", "localhost,", "-m", "pdctl.vllm_pd.sla_gate",
                           "-a", json.dumps(args), "-e", "ansible_python_interpreter=%s" % sys.executable],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          )
    assert proc.returncode != 0
    assert "context 1024: mean TPOT" in proc.stdout and "> limit 20.00 ms" in proc.stdout


def _yaml(tmp_path, data):
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)
