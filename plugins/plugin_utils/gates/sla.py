"""SLA gate: run the real benchmark client through the router per context length, and search the SLA capacity.

The client is ``vllm bench serve`` (production, from the vLLM venv on a serving host: give ``exec_prefix``
such as ``["ssh", "decode-0"]`` and ``client: ["<pdctl_paths.venvs>/current/bin/vllm", "bench", "serve"]``) or the
standalone ``vllm-rs bench serve`` (lab; same flags, same saved JSON). Each run uses the random data set at
exact lengths (``--random-range-ratio 0 --ignore-eos``) and ``--save-result``; the gate reads the saved JSON
(keys: completed, failed, mean_ttft_ms, mean_tpot_ms, std_*, p99_*, ...).

Verdict per context length: failed == 0, mean TTFT <= max_ttft_ms and mean TPOT <= max_tpot_ms.
SLA capacity: the highest max-concurrency at which both limits (and failed == 0) still hold, found by
doubling from ``start`` up to ``max`` and then bisecting; it assumes latency grows with concurrency.
"""
from __future__ import annotations

import copy
import json
import math
import os
import shlex
import subprocess
import time
from pathlib import Path

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import outcome

DEFAULTS = {
    "contexts": [16384, 65536, 131072, 262144],
    "output_len": 1024,
    "concurrency": 8,
    "num_prompts": None,  # None: max(min_prompts, prompts_per_slot * concurrency)
    "min_prompts": 64,
    "prompts_per_slot": 4,
    "num_warmups": 0,
    "max_ttft_ms": 2500.0,
    "max_tpot_ms": 20.0,
    "client": ["vllm", "bench", "serve"],
    "exec_prefix": [],
    "env": {},
    "backend": "openai",
    "model": None,
    "tokenizer": None,
    "prompt_token_ids": False,
    "seed": 0,
    "extra_args": [],
    "bench_timeout_s": 1800,
    "remote_result_dir": "/tmp/pdctl-sla",
    "capacity": {"enabled": False, "contexts": None, "start": 1, "max": 256},
}

RESULT_KEYS = ("completed", "failed", "duration", "request_throughput", "output_throughput",
               "total_input_tokens", "total_output_tokens", "max_concurrency", "request_goodput")


class SlaError(Exception):
    pass


def merge_config(overrides: dict | None) -> dict:
    cfg = copy.deepcopy(DEFAULTS)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key == "capacity" and isinstance(value, dict):
            cfg["capacity"].update({k: v for k, v in value.items() if v is not None})
        else:
            cfg[key] = value
    for key in ("client", "exec_prefix", "extra_args"):
        if isinstance(cfg[key], str):
            cfg[key] = shlex.split(cfg[key])
    return cfg


def validate(cfg: dict) -> list[str]:
    problems = []
    contexts = cfg["contexts"]
    if not contexts or not all(isinstance(c, int) and c > 0 for c in contexts):
        problems.append("contexts must be a non-empty list of positive integers, got %r" % (contexts,))
    for key in ("output_len", "concurrency", "min_prompts", "prompts_per_slot"):
        if not isinstance(cfg[key], int) or cfg[key] < 1:
            problems.append("%s must be a positive integer, got %r" % (key, cfg[key]))
    for key in ("max_ttft_ms", "max_tpot_ms"):
        if not isinstance(cfg[key], (int, float)) or cfg[key] <= 0:
            problems.append("%s must be a positive number, got %r" % (key, cfg[key]))
    if not cfg["client"]:
        problems.append("client (the benchmark command, e.g. 'vllm bench serve') is empty")
    elif not cfg["exec_prefix"] and not _which(cfg["client"][0]):
        problems.append("benchmark client %s not found" % cfg["client"][0])
    cap = cfg["capacity"]
    if cap.get("enabled") and not (1 <= int(cap["start"]) <= int(cap["max"])):
        problems.append("capacity needs 1 <= start <= max, got %r..%r" % (cap["start"], cap["max"]))
    return problems


def _which(name: str) -> bool:
    if os.sep in name:
        return os.access(name, os.X_OK)
    from shutil import which

    return which(name) is not None


def num_prompts(cfg: dict, concurrency: int, probe: bool = False) -> int:
    """Requests per run: num_prompts if set, else max(min_prompts, prompts_per_slot x concurrency).

    Capacity probes always send at least prompts_per_slot x concurrency, so every slot turns over.
    """
    per_slot = int(cfg["prompts_per_slot"]) * concurrency
    if cfg["num_prompts"]:
        return max(int(cfg["num_prompts"]), per_slot) if probe else int(cfg["num_prompts"])
    return max(int(cfg["min_prompts"]), per_slot)


def bench_argv(cfg: dict, base_url: str, input_len: int, concurrency: int, result_dir: str,
               result_filename: str, probe: bool = False) -> list[str]:
    argv = list(cfg["client"]) + [
        "--backend", cfg["backend"], "--base-url", base_url.rstrip("/"),
        "--dataset-name", "random", "--random-input-len", str(input_len),
        "--random-output-len", str(cfg["output_len"]), "--random-range-ratio", "0", "--ignore-eos",
        "--num-prompts", str(num_prompts(cfg, concurrency, probe)), "--max-concurrency", str(concurrency),
        "--request-rate", "inf", "--seed", str(cfg["seed"]),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--goodput", "ttft:%g" % cfg["max_ttft_ms"], "tpot:%g" % cfg["max_tpot_ms"],
        "--save-result", "--result-dir", result_dir, "--result-filename", result_filename,
        "--disable-tqdm",
    ]
    if cfg["model"]:
        argv += ["--model", cfg["model"]]
    if cfg["tokenizer"]:
        argv += ["--tokenizer", cfg["tokenizer"]]
    if cfg["prompt_token_ids"]:
        argv.append("--prompt-token-ids")
    if cfg["num_warmups"]:
        argv += ["--num-warmups", str(cfg["num_warmups"])]
    return argv + list(cfg["extra_args"])


def _full_argv(cfg: dict, argv: list[str]) -> list[str]:
    if not cfg["exec_prefix"]:
        return argv
    # A remote shell (ssh) joins its arguments into one command line: quote it ourselves. The
    # environment (it may hold the API key) arrives on stdin, so it never shows in a command line.
    reader = 'while IFS= read -r kv; do export "$kv"; done; ' if cfg["env"] else ""
    return list(cfg["exec_prefix"]) + [reader + "exec " + shlex.join(argv)]


def _remote_env_input(cfg: dict) -> str | None:
    if not cfg["exec_prefix"] or not cfg["env"]:
        return None
    return "".join("%s=%s\n" % (k, v) for k, v in cfg["env"].items())


def run_bench(cfg: dict, base_url: str, input_len: int, concurrency: int, workdir: Path,
              probe: bool = False) -> dict:
    """Run one benchmark; return its parsed saved result plus the command line and wall time."""
    name = "bench-in%d-c%d-%d.json" % (input_len, concurrency, int(time.time() * 1000))
    remote = bool(cfg["exec_prefix"])
    result_dir = cfg["remote_result_dir"] if remote else str(workdir)
    if not remote:
        workdir.mkdir(parents=True, exist_ok=True)
    argv = bench_argv(cfg, base_url, input_len, concurrency, result_dir, name, probe)
    env = None if remote else {**os.environ, **{k: str(v) for k, v in cfg["env"].items()}}
    started = time.monotonic()
    try:
        proc = subprocess.run(_full_argv(cfg, argv), check=False, capture_output=True, text=True, env=env,
                              input=_remote_env_input(cfg), timeout=float(cfg["bench_timeout_s"]))
    except subprocess.TimeoutExpired:
        raise SlaError("context %d: the benchmark client ran past %ss (concurrency %d)"
                       % (input_len, cfg["bench_timeout_s"], concurrency)) from None
    except OSError as exc:
        raise SlaError("cannot run the benchmark client %s: %s" % (argv[0], exc)) from None
    wall = time.monotonic() - started
    log = workdir / (name[:-5] + ".log")
    workdir.mkdir(parents=True, exist_ok=True)
    log.write_text("$ %s\n%s\n%s" % (shlex.join(argv), proc.stdout, proc.stderr))
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise SlaError("context %d: the benchmark client exited %d (concurrency %d): %s"
                       % (input_len, proc.returncode, concurrency, " | ".join(tail)))
    path = Path(result_dir) / name
    if remote:
        cat = subprocess.run(_full_argv(cfg, ["cat", str(path)]), check=False, capture_output=True, text=True,
                             input=_remote_env_input(cfg), timeout=120)
        if cat.returncode != 0:
            raise SlaError("context %d: cannot read the saved result %s: %s" % (input_len, path, cat.stderr.strip()))
        raw = cat.stdout
        (workdir / name).write_text(raw)
    else:
        if not path.is_file():
            raise SlaError("context %d: the benchmark client saved no result at %s" % (input_len, path))
        raw = path.read_text()
    result = parse_result(json.loads(raw))
    result.update(input_len=input_len, concurrency=concurrency, num_prompts=num_prompts(cfg, concurrency, probe),
                  wall_s=round(wall, 2), command=shlex.join(argv), result_file=str(workdir / name))
    return result


def parse_result(data: dict) -> dict:
    """The figures the gate needs from a saved `vllm bench serve` result."""
    out = {k: data.get(k) for k in RESULT_KEYS}
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p90", "p99"):
            key = "%s_%s_ms" % (stat, metric)
            if key in data:
                out[key] = data[key]
    for key in ("mean_ttft_ms", "mean_tpot_ms"):
        if not isinstance(out.get(key), (int, float)):
            raise SlaError("saved result lacks %s" % key)
    if out["completed"] is None:
        raise SlaError("saved result lacks completed")
    if out["failed"] is None:  # older clients: derive from the number of prompts
        out["failed"] = max(0, int(data.get("num_prompts", out["completed"])) - int(out["completed"]))
    out.update({k: v for k, v in data.items() if k.startswith("spec_decode_")})
    steady = data.get("steady_state")  # vllm-rs: figures over the window at full concurrency
    if isinstance(steady, dict):
        out["steady_state"] = {k: steady.get(k) for k in ("mean_ttft_ms", "mean_tpot_ms", "request_throughput")}
    n = max(1, int(out["completed"]))
    for metric in ("ttft", "tpot"):  # standard error of the mean, from the observed spread
        std = out.get("std_%s_ms" % metric)
        out["sem_%s_ms" % metric] = std / math.sqrt(n) if isinstance(std, (int, float)) else None
    return out


def judge(result: dict, cfg: dict) -> list[str]:
    """Failure messages for one benchmark result (empty: it meets the SLA)."""
    ctx, c = result["input_len"], result["concurrency"]
    problems = []
    if int(result["failed"] or 0) > 0 or int(result["completed"] or 0) == 0:
        problems.append("context %d: %s of %s requests failed (concurrency %d)"
                        % (ctx, result["failed"], result["num_prompts"], c))
    # The client counts a request as completed on its status; the one outcome rule also wants the tokens
    # asked for (--ignore-eos at an exact output length: every completed answer is output_len long).
    completed, output = int(result["completed"] or 0), result.get("total_output_tokens")
    if completed and outcome.failure_kind(200, True, "length", output, completed * int(cfg["output_len"])):
        problems.append("context %d: short answers: %s output tokens from %d completed requests, expected %d "
                        "(concurrency %d)" % (ctx, output, completed, completed * int(cfg["output_len"]), c))
    if result["mean_ttft_ms"] > cfg["max_ttft_ms"]:
        problems.append("context %d: mean TTFT %.0f ms > limit %.0f ms (concurrency %d)"
                        % (ctx, result["mean_ttft_ms"], cfg["max_ttft_ms"], c))
    if result["mean_tpot_ms"] > cfg["max_tpot_ms"]:
        problems.append("context %d: mean TPOT %.2f ms > limit %.2f ms (concurrency %d)"
                        % (ctx, result["mean_tpot_ms"], cfg["max_tpot_ms"], c))
    return problems


def search_capacity(passes, start: int = 1, maximum: int = 256) -> tuple[int, dict]:
    """Highest c in [start, maximum] with passes(c), assuming passes is monotone (True, then False).

    Doubling from start until a failure or the maximum, then bisection between the last pass and the first
    failure. Returns (capacity, {c: passed}); capacity 0 means even `start` fails.
    """
    probes = {}

    def ok(c):
        if c not in probes:
            probes[c] = bool(passes(c))
        return probes[c]

    if not ok(start):
        return 0, probes
    good, bad = start, None
    while bad is None:
        nxt = min(good * 2, maximum)
        if nxt == good:
            return good, probes
        if ok(nxt):
            good = nxt
        else:
            bad = nxt
    while bad - good > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good, probes


def run(base_url: str, config: dict | None, workdir) -> dict:
    """Run the SLA gate; returns the report (raises ValueError on bad input; a context the client could not
    measure twice is a failure in the report, and the other contexts are still measured)."""
    cfg = merge_config(config)
    problems = validate(cfg)
    if problems:
        raise ValueError("; ".join(problems))
    workdir = Path(workdir)
    started = time.time()
    runs, unmeasured, failures = [], [], []
    for ctx in cfg["contexts"]:
        try:
            result = _bench_with_one_retry(cfg, base_url, ctx, workdir / "bench")
        except SlaError as exc:
            # This context has no measurement; the others still get theirs, so the report says which
            # lengths met the SLA and which could not be measured.
            failures.append(str(exc))
            unmeasured.append({"input_len": ctx, "concurrency": int(cfg["concurrency"]), "error": str(exc)})
            continue
        result["problems"] = judge(result, cfg)
        result["passed"] = not result["problems"]
        failures += result["problems"]
        runs.append(result)
    report = {"gate": "sla", "router_url": base_url, "started": started,
              "limits": {"max_ttft_ms": cfg["max_ttft_ms"], "max_tpot_ms": cfg["max_tpot_ms"]},
              "concurrency": cfg["concurrency"], "output_len": cfg["output_len"], "runs": runs,
              "unmeasured": unmeasured,
              "settings": {k: v for k, v in cfg.items() if k != "env"}}
    cap = cfg["capacity"]
    if cap.get("enabled"):
        report["capacity"] = capacity(cfg, base_url, workdir / "bench", cap)
    report["wall_s"] = round(time.time() - started, 1)
    report["failures"] = failures
    report["passed"] = not failures
    return report


def _bench_with_one_retry(cfg: dict, base_url: str, ctx: int, workdir: Path) -> dict:
    """One benchmark run; a client that exits before measuring gets one more try.

    The client exits non-zero only when it cannot start (it counts failed requests itself and exits 0):
    its first request, GET /v1/models when no model is given, or the connection, met a moment the
    service could not answer. One such moment is no verdict on the deployment; two in a row is reported.
    """
    try:
        return run_bench(cfg, base_url, ctx, int(cfg["concurrency"]), workdir)
    except SlaError as first:
        time.sleep(2)
        try:
            result = run_bench(cfg, base_url, ctx, int(cfg["concurrency"]), workdir)
        except SlaError as second:
            raise SlaError("%s (and again after a retry: %s)" % (second, first)) from None
        result["retried_after"] = str(first)
        return result


def capacity(cfg: dict, base_url: str, workdir: Path, cap: dict) -> dict:
    contexts = cap.get("contexts") or [max(cfg["contexts"])]
    per_context, probes = {}, []
    for ctx in contexts:
        def passes(c, ctx=ctx):
            result = run_bench(cfg, base_url, ctx, c, workdir, probe=True)
            result["problems"] = judge(result, cfg)
            result["passed"] = not result["problems"]
            probes.append(result)
            return result["passed"]

        per_context[ctx], _probes = search_capacity(passes, int(cap["start"]), int(cap["max"]))
    limit = min(per_context.values())
    return {"per_context": per_context, "max_concurrency": limit, "bounded_by_max": limit >= int(cap["max"]),
            "router_max_concurrent_requests": limit, "probes": probes}
