"""SLA gate logic without a server: saved-result parsing, verdicts, command line, capacity search."""
from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import sla

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gates" / "vllm_rs_bench_result.json"


def test_parse_real_saved_result():
    """A result saved by vllm-rs 0.33.0 bench serve (--save-result), keys as facts.md lists them."""
    data = json.loads(FIXTURE.read_text())
    out = sla.parse_result(data)
    assert out["completed"] == data["completed"] and out["failed"] == 0
    assert out["mean_ttft_ms"] == data["mean_ttft_ms"] and out["mean_tpot_ms"] == data["mean_tpot_ms"]
    assert out["p99_tpot_ms"] == data["p99_tpot_ms"]
    assert out["sem_tpot_ms"] == pytest.approx(data["std_tpot_ms"] / data["completed"] ** 0.5)
    assert out["steady_state"]["mean_ttft_ms"] == data["steady_state"]["mean_ttft_ms"]


def test_parse_rejects_incomplete_and_derives_failed():
    with pytest.raises(sla.SlaError, match="mean_tpot_ms"):
        sla.parse_result({"completed": 1, "failed": 0, "mean_ttft_ms": 1.0})
    out = sla.parse_result({"completed": 6, "num_prompts": 8, "mean_ttft_ms": 1.0, "mean_tpot_ms": 1.0})
    assert out["failed"] == 2


def _result(**kw):
    base = {"input_len": 65536, "concurrency": 8, "num_prompts": 64, "completed": 64, "failed": 0,
            "mean_ttft_ms": 900.0, "mean_tpot_ms": 17.0, "total_output_tokens": 64 * 1024}
    base.update(kw)
    return base


def test_judge_names_context_and_value():
    cfg = sla.merge_config({})
    assert sla.judge(_result(), cfg) == []
    msgs = sla.judge(_result(mean_tpot_ms=23.456), cfg)
    assert msgs == ["context 65536: mean TPOT 23.46 ms > limit 20.00 ms (concurrency 8)"]
    msgs = sla.judge(_result(mean_ttft_ms=3100.0, failed=2, completed=62), cfg)
    assert any("context 65536: mean TTFT 3100 ms > limit 2500 ms" in m for m in msgs)
    assert any("2 of 64 requests failed" in m for m in msgs)


def test_judge_counts_short_answers_as_failures():
    """The one outcome rule: with --ignore-eos every completed answer has output_len tokens; fewer (an
    answer aborted with HTTP 200, which the client counts as completed) fails the gate; no count fails too."""
    cfg = sla.merge_config({})
    msgs = sla.judge(_result(total_output_tokens=64 * 1024 - 22), cfg)
    assert msgs == ["context 65536: short answers: 65514 output tokens from 64 completed requests, expected "
                    "65536 (concurrency 8)"]
    assert sla.judge(_result(total_output_tokens=None), cfg)


def test_bench_argv_exact_lengths_and_saved_result():
    cfg = sla.merge_config({"client": "vllm bench serve", "tokenizer": "/m", "concurrency": 4})
    argv = sla.bench_argv(cfg, "http://r:8000/", 16384, 4, "/tmp/d", "r.json")
    s = " ".join(argv)
    assert argv[:3] == ["vllm", "bench", "serve"]
    for flag in ("--base-url http://r:8000", "--random-input-len 16384", "--random-output-len 1024",
                 "--random-range-ratio 0", "--ignore-eos", "--num-prompts 64", "--max-concurrency 4",
                 "--save-result", "--result-dir /tmp/d", "--result-filename r.json", "--tokenizer /m",
                 "--goodput ttft:2500 tpot:20", "--dataset-name random"):
        assert flag in s
    assert sla.num_prompts(cfg, 32) == 128 and sla.num_prompts(dict(cfg, num_prompts=10), 32) == 10
    assert sla.num_prompts(dict(cfg, num_prompts=10), 32, probe=True) == 128


def test_remote_client_is_quoted_for_the_remote_shell():
    cfg = sla.merge_config({"exec_prefix": "ssh decode-0", "env": {"VLLM_USE_RUST_BENCH": "1"},
                            "client": ["/opt/v env/bin/vllm", "bench", "serve"]})
    argv = ["/opt/v env/bin/vllm", "bench", "serve", "--extra-body", '{"a": 1}']
    full = sla._full_argv(cfg, argv)
    assert full[:2] == ["ssh", "decode-0"] and len(full) == 3
    assert full[2].endswith("exec " + shlex.join(argv))
    # The environment (the API key among it) goes over stdin, never into the remote command line.
    assert "VLLM_USE_RUST_BENCH" not in full[2]
    assert sla._remote_env_input(cfg) == "VLLM_USE_RUST_BENCH=1\n"
    # The remote shell really exports what it reads, then runs the client.
    shell = subprocess.run(["sh", "-c", full[2].replace(shlex.join(argv), "printenv VLLM_USE_RUST_BENCH")],
                           input=sla._remote_env_input(cfg), capture_output=True, text=True)
    assert shell.stdout.strip() == "1"


def test_validate_names_each_problem(tmp_path):
    assert sla.validate(sla.merge_config({"client": ["/nonexistent/vllm-rs", "bench", "serve"]})) == [
        "benchmark client /nonexistent/vllm-rs not found"]
    problems = sla.validate(sla.merge_config({"exec_prefix": ["ssh", "h"], "contexts": [0],
                                              "max_tpot_ms": -1, "capacity": {"enabled": True, "start": 9,
                                                                              "max": 4}}))
    assert problems == ["contexts must be a non-empty list of positive integers, got [0]",
                        "max_tpot_ms must be a positive number, got -1",
                        "capacity needs 1 <= start <= max, got 9..4"]  # the remote client is not looked up here
    for key, value in (("output_len", 0), ("concurrency", "4"), ("max_ttft_ms", 0)):
        assert sla.validate(sla.merge_config({"exec_prefix": ["ssh", "h"], key: value}))[0].startswith(
            "%s must be a positive" % key), key
    client = tmp_path / "vllm-rs"
    client.write_text("#!/bin/sh\n")
    client.chmod(0o755)
    assert sla.validate(sla.merge_config({"client": [str(client), "bench", "serve"]})) == []


@pytest.mark.parametrize("threshold", list(range(0, 41)))
def test_capacity_search_on_monotone_function(threshold):
    calls = []

    def passes(c):
        calls.append(c)
        return c <= threshold

    cap, probes = sla.search_capacity(passes, start=1, maximum=32)
    assert cap == min(threshold, 32)
    assert len(calls) == len(set(calls))  # no concurrency measured twice
    assert len(calls) <= 12  # doubling (<= 6) + bisection (<= 4) + slack
    assert all(probes[c] == (c <= threshold) for c in probes)


def test_capacity_search_start_above_one():
    cap, probes = sla.search_capacity(lambda c: c <= 37, start=4, maximum=256)
    assert cap == 37 and min(probes) == 4


def _fake_bench(outcomes):
    """run_bench stand-in: per context, a list of results or SlaErrors, consumed in order."""
    calls = []

    def bench(cfg, base_url, input_len, concurrency, workdir, probe=False):
        calls.append(input_len)
        outcome = outcomes[input_len].pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return dict(outcome, input_len=input_len, concurrency=concurrency)
    return bench, calls


GOOD = {"completed": 16, "failed": 0, "mean_ttft_ms": 500.0, "mean_tpot_ms": 10.0, "total_output_tokens": 512,
        "num_prompts": 16}


def test_a_client_that_cannot_start_is_retried_once(tmp_path, monkeypatch):
    bench, calls = _fake_bench({1024: [GOOD], 65536: [sla.SlaError("context 65536: the benchmark client exited 1"),
                                                       GOOD]})
    monkeypatch.setattr(sla, "run_bench", bench)
    monkeypatch.setattr(sla.time, "sleep", lambda s: None)
    monkeypatch.setattr(sla, "judge", lambda result, cfg: [])
    report = sla.run("https://fd:8443", {"contexts": [1024, 65536], "output_len": 32, "concurrency": 4, "client": ["true"]}, tmp_path)
    assert report["passed"] and calls == [1024, 65536, 65536]
    assert "exited 1" in report["runs"][1]["retried_after"] and report["unmeasured"] == []


def test_a_context_the_client_fails_twice_is_a_failure_and_the_others_are_still_measured(tmp_path, monkeypatch):
    err = sla.SlaError("context 4096: the benchmark client exited 1 (concurrency 4): GET /v1/models 503")
    bench, calls = _fake_bench({1024: [GOOD], 4096: [err, err], 65536: [dict(GOOD, mean_tpot_ms=25.0)]})
    monkeypatch.setattr(sla, "run_bench", bench)
    monkeypatch.setattr(sla.time, "sleep", lambda s: None)
    report = sla.run("https://fd:8443", {"contexts": [1024, 4096, 65536], "output_len": 32, "concurrency": 4,
                                          "max_tpot_ms": 20, "client": ["true"]}, tmp_path)
    assert not report["passed"] and calls == [1024, 4096, 4096, 65536]
    assert [r["input_len"] for r in report["runs"]] == [1024, 65536]
    assert report["unmeasured"][0]["input_len"] == 4096
    assert any("again after a retry" in f and "context 4096" in f for f in report["failures"])
    assert any("context 65536" in f and "mean TPOT" in f for f in report["failures"])
    from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import report as gate_report
    assert "| 4096 | not measured" in gate_report.sla_markdown(dict(report, wall_s=1.0))
