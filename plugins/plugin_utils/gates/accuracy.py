"""Accuracy smoke gate: ask the deployment (through the router) AIME / GPQA / LongBench v2 questions and decide.

Verdict per benchmark (all must hold):
- floor: correct >= the highest floor whose false-alarm rate at the expected accuracy is <= alpha
  (exact binomial; defaults reproduce facts.md: GPQA 64 -> 52, AIME 30x4 -> 92/120, LongBench 60 -> 27),
  or an explicit ``floor`` count;
- reference (when a report of a known-good deployment is given): no drop beyond the exact one-sided
  Fisher test at ``reference_alpha``;
- parse rate >= ``min_parse_rate`` and truncation rate <= ``max_truncation_rate``;
- failed requests (the outcome rule's failures: no answer, an error status or body, an aborted or short answer;
  and those the time budget left unasked) at most ``max_failed_share`` of the requests, whatever the accuracy: a
  gate that could not ask has not measured it.
Unparsable, length-truncated, failed and timed-out answers all count as wrong.
"""
from __future__ import annotations

import asyncio
import copy
import time

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import outcome
from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import datasets, prompts, stats

DEFAULTS = {
    "benchmarks": ["aime", "gpqa", "longbench"],
    "seed": 20251129,
    "concurrency": 64,
    "time_budget_s": 3600,
    "request_timeout_s": 1800,
    "temperature": 1.0,  # GLM model card: sampling, not greedy
    "top_p": 0.95,
    "alpha": 0.001,
    "reference_alpha": 0.01,
    "min_parse_rate": 0.95,
    "max_truncation_rate": 0.05,
    "max_failed_share": 0.02,
    "api_key": "EMPTY",
    "ca_file": None,  # CA bundle that signed the front door's certificate (None: the system's)
    "aime": {"samples": None, "repeats": 4, "expected_accuracy": 0.8667, "max_tokens": 32768},
    "gpqa": {"samples": 64, "repeats": 1, "expected_accuracy": 0.9289, "max_tokens": 32768},
    "longbench": {"buckets": {"short": 20, "medium": 20, "long": 20}, "repeats": 1,
                  "expected_accuracy": 0.6401, "max_tokens": 16384, "max_context_tokens": 120000},
    "datasets": {},  # {name: {"repo_id", "revision", "files": {path: sha256}}}
    "local_dir": None,
    "cache_dir": None,
    "hub_endpoint": None,
}

_EXTRACT = {"aime": prompts.aime_extract, "gpqa": prompts.gpqa_extract, "longbench": prompts.longbench_extract}


def merge_config(overrides: dict | None) -> dict:
    """DEFAULTS deep-merged with overrides (None values in overrides are ignored)."""
    cfg = copy.deepcopy(DEFAULTS)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if isinstance(value, dict) and isinstance(cfg.get(key), dict) and key != "datasets":
            cfg[key].update({k: v for k, v in value.items() if v is not None})
        else:
            cfg[key] = value
    return cfg


def validate(cfg: dict) -> list[str]:
    """Problems with a configuration, without touching the network (check mode runs only this)."""
    problems = []
    for name in cfg["benchmarks"]:
        if name not in datasets.BENCHMARKS:
            problems.append("unknown benchmark %r (known: %s)" % (name, ", ".join(datasets.BENCHMARKS)))
            continue
        settings = cfg[name]
        p = settings.get("expected_accuracy")
        if settings.get("floor") is None and not (isinstance(p, (int, float)) and 0 < p <= 1):
            problems.append("%s: expected_accuracy must be in (0, 1] (or give an explicit floor)" % name)
        if int(settings.get("repeats") or 1) < 1:
            problems.append("%s: repeats must be >= 1" % name)
        if not cfg.get("local_dir"):
            source = cfg["datasets"].get(name) or {}
            revision = str(source.get("revision") or "")
            if len(revision) != 40:
                problems.append("%s: no local_dir and no pinned 40-hex revision in datasets.%s" % (name, name))
            if not source.get("files") or not all(isinstance(source["files"], dict) and v
                                                  for v in (source.get("files") or {}).values()):
                problems.append("%s: datasets.%s.files must map every file to its sha256" % (name, name))
    for key in ("alpha", "reference_alpha"):
        if not 0 < float(cfg[key]) < 1:
            problems.append("%s must be in (0, 1)" % key)
    if not all(0 <= float(cfg[k]) <= 1 for k in ("min_parse_rate", "max_truncation_rate", "max_failed_share")):
        problems.append("min_parse_rate, max_truncation_rate and max_failed_share must be in [0, 1]")
    if int(cfg["concurrency"]) < 1 or float(cfg["time_budget_s"]) <= 0:
        problems.append("concurrency must be >= 1 and time_budget_s > 0")
    return problems


# --- asking ---------------------------------------------------------------------------------------

def grade(item: datasets.Item, content: str | None, finish_reason: str | None) -> dict:
    content = content or ""
    extracted = _EXTRACT[item.benchmark](content)
    if item.benchmark == "aime":
        correct = prompts.aime_correct(extracted, item.answer)
    else:
        correct = prompts.letter_correct(extracted, item.answer)
    truncated = finish_reason == "length"
    return {
        "extracted": extracted,
        "parsed": extracted is not None,
        "truncated": truncated,
        "correct": bool(correct and not truncated),
        "empty_content": not content.strip(),
        "leaked_think": "<think>" in content or "</think>" in content,
    }


async def _ask(client, semaphore, deadline, model, item, repeat, settings, cfg) -> dict:
    import openai

    record = {"benchmark": item.benchmark, "id": item.id, "repeat": repeat, "expected": item.answer,
              "prompt_sha256": item.prompt_sha256, **{k: v for k, v in item.meta.items() if v is not None}}
    async with semaphore:
        if time.monotonic() >= deadline:
            record.update(status="timeout", extracted=None, parsed=False, truncated=False, correct=False)
            return record
        started = time.monotonic()
        try:
            resp = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": item.prompt}],
                temperature=cfg["temperature"], top_p=cfg["top_p"], max_tokens=int(settings["max_tokens"]))
        except openai.APIStatusError as exc:
            record.update(status="error", error="HTTP %d" % exc.status_code, failure_kind="status")
        except (openai.APIError, asyncio.TimeoutError) as exc:
            record.update(status="error", error=type(exc).__name__, failure_kind="status")
        else:
            choice = resp.choices[0]
            message = choice.message
            content = message.content or ""
            reasoning = (message.model_extra or {}).get("reasoning") or ""
            tokens = getattr(resp.usage, "completion_tokens", None)
            # The one request-outcome rule: an aborted or short answer is an error, not a wrong answer; so is a
            # body that carries an error beside its choices.
            kind = outcome.failure_kind(200, True, choice.finish_reason, tokens, int(settings["max_tokens"]),
                                        error="error" in (resp.model_extra or {}), text=bool(content or reasoning))
            record.update(status="ok" if kind is None else "error", finish_reason=choice.finish_reason,
                          completion_tokens=tokens, content_chars=len(content), reasoning_chars=len(reasoning),
                          **grade(item, content, choice.finish_reason))
            if kind is not None:
                record.update(error="%s: finish_reason %s, %s of %s tokens" % (
                    kind, choice.finish_reason, tokens, settings["max_tokens"]), failure_kind=kind)
            if item.public:
                record["response_tail"] = content[-300:]
        record["latency_s"] = round(time.monotonic() - started, 3)
    if record["status"] != "ok":
        record.update(extracted=None, parsed=False, truncated=False, correct=False)
    return record


async def ask_all(base_url: str, model: str, work: list, cfg: dict) -> list[dict]:
    """work: [(item, repeat, settings)]; answers within cfg time_budget_s, the rest count as timeouts."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=cfg["api_key"] or "EMPTY",
                         timeout=float(cfg["request_timeout_s"]), max_retries=0,
                         http_client=_http_client(cfg.get("ca_file")))
    semaphore = asyncio.Semaphore(int(cfg["concurrency"]))
    deadline = time.monotonic() + float(cfg["time_budget_s"])
    tasks = [asyncio.ensure_future(_ask(client, semaphore, deadline, model, item, repeat, settings, cfg))
             for item, repeat, settings in work]
    try:
        if tasks:
            await asyncio.wait(tasks, timeout=float(cfg["time_budget_s"]))
        results = []
        for task, (item, repeat, _slot) in zip(tasks, work):
            if task.done() and not task.cancelled():
                results.append(task.result())
            else:
                task.cancel()
                results.append({"benchmark": item.benchmark, "id": item.id, "repeat": repeat,
                                "expected": item.answer, "prompt_sha256": item.prompt_sha256,
                                "status": "timeout", "extracted": None, "parsed": False,
                                "truncated": False, "correct": False})
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await client.close()
    return results


def _http_client(ca_file):
    """The OpenAI client's HTTP client, trusting ca_file (the front door's CA) when given."""
    if not ca_file:
        return None
    import ssl

    from openai import DefaultAsyncHttpxClient

    return DefaultAsyncHttpxClient(verify=ssl.create_default_context(cafile=ca_file))


async def served_model(base_url: str, api_key: str = "EMPTY", ca_file: str | None = None) -> str:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=api_key or "EMPTY", max_retries=2,
                         http_client=_http_client(ca_file))
    try:
        models = await client.models.list()
        return models.data[0].id
    finally:
        await client.close()


# --- deciding -------------------------------------------------------------------------------------

def summarize(name: str, results: list[dict], settings: dict, cfg: dict, reference: dict | None) -> dict:
    n = len(results)
    correct = sum(1 for r in results if r["correct"])
    parsed = sum(1 for r in results if r["parsed"])
    truncated = sum(1 for r in results if r.get("truncated"))
    summary = {
        "samples": n, "correct": correct, "accuracy": correct / n if n else 0.0,
        "ci95": stats.clopper_pearson(correct, n) if n else None,
        "parse_rate": parsed / n if n else 0.0, "truncation_rate": truncated / n if n else 0.0,
        "unparsable": n - parsed, "truncated": truncated,
        "errors": sum(1 for r in results if r["status"] == "error"),
        "errors_by_kind": outcome.count_kinds(r.get("failure_kind") for r in results if r["status"] == "error"),
        "timeouts": sum(1 for r in results if r["status"] == "timeout"),
        "empty_content": sum(1 for r in results if r.get("empty_content")),
        "leaked_think": sum(1 for r in results if r.get("leaked_think")),
    }
    checks = []
    if settings.get("floor") is not None:
        floor = int(settings["floor"])
        floor_note = "configured floor"
    else:
        p = float(settings["expected_accuracy"])
        floor = stats.floor_for(n, p, float(cfg["alpha"]))
        floor_note = "floor for expected accuracy %.1f%% at false-alarm %.2g" % (100 * p, stats.false_alarm(n, p, floor))
    summary["floor"] = floor
    checks.append(_check("floor", correct >= floor,
                         "%s: %d/%d correct (%.1f%%) %s the floor %d (%s)"
                         % (name, correct, n, 100 * summary["accuracy"], "meets" if correct >= floor else "is below",
                            floor, floor_note)))
    if reference:
        k_ref, n_ref = int(reference["correct"]), int(reference["samples"])
        p_value = stats.drop_p_value(correct, n, k_ref, n_ref)
        need = stats.min_passing(n, k_ref, n_ref, float(cfg["reference_alpha"]))
        summary["reference"] = {"correct": k_ref, "samples": n_ref, "p_value": p_value, "min_passing": need}
        checks.append(_check("reference", p_value >= float(cfg["reference_alpha"]),
                             "%s: %d/%d correct vs reference %d/%d: drop p-value %.3g (level %.3g, %d needed)"
                             % (name, correct, n, k_ref, n_ref, p_value, float(cfg["reference_alpha"]), need)))
    checks.append(_check("parse_rate", summary["parse_rate"] >= float(cfg["min_parse_rate"]),
                         "%s: parse rate %.1f%% (%d of %d unparsable), minimum %.1f%%"
                         % (name, 100 * summary["parse_rate"], n - parsed, n, 100 * float(cfg["min_parse_rate"]))))
    failed = summary["errors"] + summary["timeouts"]
    summary["failed_share"] = failed / n if n else 0.0
    checks.append(_check("failed_share", summary["failed_share"] <= float(cfg["max_failed_share"]),
                         "%s: %d of %d requests failed (%.1f%%: %s, %d left unasked by the time budget), maximum "
                         "%.1f%%" % (name, failed, n, 100 * summary["failed_share"],
                                     ", ".join("%s %s" % (c, k) for k, c in summary["errors_by_kind"].items() if c)
                                     or "no error", summary["timeouts"], 100 * float(cfg["max_failed_share"]))))
    checks.append(_check("truncation_rate", summary["truncation_rate"] <= float(cfg["max_truncation_rate"]),
                         "%s: truncation rate %.1f%% (%d of %d hit max_tokens %d), maximum %.1f%%"
                         % (name, 100 * summary["truncation_rate"], truncated, n, int(settings["max_tokens"]),
                            100 * float(cfg["max_truncation_rate"]))))
    summary["checks"] = checks
    summary["passed"] = all(c["ok"] for c in checks)
    return summary


def _check(name, ok, message):
    return {"name": name, "ok": bool(ok), "message": message}


def load_reference(path) -> dict:
    """{benchmark: {"correct", "samples"}} from an accuracy report (accuracy.json) of a known-good run."""
    import json
    from pathlib import Path

    data = json.loads(Path(path).read_text())
    return {name: {"correct": b["correct"], "samples": b["samples"]}
            for name, b in (data.get("benchmarks") or {}).items()}


def run(base_url: str, config: dict | None = None, model: str | None = None, token: str | None = None,
        reference: dict | None = None) -> tuple[dict, list[dict]]:
    """Run the gate; returns (report, per-item results). Raises datasets.DatasetError / ValueError on bad input."""
    cfg = merge_config(config)
    problems = validate(cfg)
    if problems:
        raise ValueError("; ".join(problems))
    started = time.time()
    model = model or asyncio.run(served_model(base_url, cfg["api_key"], cfg.get("ca_file")))
    work, provenance = [], {}
    for name in cfg["benchmarks"]:
        settings = cfg[name]
        items, provenance[name] = datasets.load_benchmark(
            name, cfg["datasets"].get(name) or {}, settings, int(cfg["seed"]), local_dir=cfg["local_dir"],
            cache_dir=cfg["cache_dir"], token=token, endpoint=cfg["hub_endpoint"])
        work += [(item, r, settings) for item in items for r in range(int(settings.get("repeats") or 1))]
    results = asyncio.run(ask_all(base_url, model, work, cfg))
    report = {"gate": "accuracy", "router_url": base_url, "model": model, "started": started,
              "wall_s": round(time.time() - started, 1), "benchmarks": {}, "datasets": provenance,
              "settings": {k: v for k, v in cfg.items() if k not in ("datasets", "api_key")}}
    for name in cfg["benchmarks"]:
        rows = [r for r in results if r["benchmark"] == name]
        report["benchmarks"][name] = summarize(name, rows, cfg[name], cfg, (reference or {}).get(name))
    report["passed"] = all(b["passed"] for b in report["benchmarks"].values())
    report["failures"] = [c["message"] for b in report["benchmarks"].values() for c in b["checks"] if not c["ok"]]
    return report, results
