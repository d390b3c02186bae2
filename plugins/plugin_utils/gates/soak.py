"""Soak gate: steady load through the router for a configured time, sampling every instance's memory and the
latency, to catch the recipe's memory leak (memory growing linearly with the requests served) and latency drift
before users do.

Memory: the instance unit's, API server and engine cores together (``pdctl_unit_memory_anon_bytes``, which
roles/monitoring's collector writes for node exporter's textfile collector on every serving host), read from
the node exporter of the instance's host. vLLM's own ``process_resident_memory_bytes`` is its API server
process's only, and exported only with one API server (with the recipe's -dp 4 / -dp 8 vLLM 0.33 runs one per DP
rank and /metrics has no process_* series at all); the recipe's leak was in the engine-core processes, so it is
recorded beside (``api_rss_bytes``, None where not exported) but not judged.

Verdict:
- **RSS** (the unit's): per instance, an ordinary least-squares line of RSS (MB) against the requests that instance has
  finished (``vllm:request_success_total``, in thousands), over the samples after the warm-up. The gate fails
  when the slope exceeds ``max_rss_slope_mb_per_1k`` AND its 95% confidence interval excludes zero (a real climb,
  not noise). Both the slope and the interval are reported.
- **Latency drift**: mean client-side request latency of the last third of the run against the first third
  (after the warm-up); fails when it grew by more than ``max_latency_drift`` (relative) and the difference is
  significant (Welch's t > 3).
- any failed request fails the gate (pdctl.outcome's rule: HTTP 200, finish_reason stop/length, the token
  count asked for; counted by kind).

``run()`` needs no Ansible (the rolling upgrade calls it between batches); ``pdctl gate soak`` wraps it.
"""
from __future__ import annotations

import math
import statistics
import threading
import time

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import outcome

DEFAULTS = {
    "duration_s": 180.0,
    "warmup_s": 20.0,
    "sample_interval_s": 2.0,
    "concurrency": 4,
    "max_tokens": 16,
    "prompt": "Describe the weather in one sentence.",
    "max_rss_slope_mb_per_1k": 20.0,
    "max_latency_drift": 0.25,
    "request_timeout_s": 120.0,
    "api_key": None,
    "ca_file": None,
    "model": None,
}


class SoakError(ValueError):
    """Invalid settings or an unreachable deployment."""


def settings(cfg: dict | None) -> dict:
    out = dict(DEFAULTS)
    for key, value in (cfg or {}).items():
        if key not in DEFAULTS:
            raise SoakError("unknown soak setting %r (known: %s)" % (key, ", ".join(sorted(DEFAULTS))))
        out[key] = value
    if float(out["duration_s"]) <= float(out["warmup_s"]):
        raise SoakError("duration_s (%s) must exceed warmup_s (%s)" % (out["duration_s"], out["warmup_s"]))
    if int(out["concurrency"]) < 1 or float(out["sample_interval_s"]) <= 0:
        raise SoakError("concurrency must be >= 1 and sample_interval_s > 0")
    return out


# --- statistics -------------------------------------------------------------------------------------

_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t975(df: int) -> float:
    """Two-sided 95% quantile of Student's t (table, rounded down to the nearest tabulated df: conservative)."""
    if df <= 0:
        return math.inf
    keys = [k for k in sorted(_T975) if k <= df]
    return 1.96 if df > 120 else _T975[keys[-1]]


def linear_fit(xs: list[float], ys: list[float]) -> dict:
    """OLS y = a + b x: slope b, its standard error and 95% confidence interval, n."""
    n = len(xs)
    if n < 3:
        return {"n": n, "slope": None, "se": None, "ci95": None, "intercept": None}
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return {"n": n, "slope": None, "se": None, "ci95": None, "intercept": None}
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    resid = sum((y - (a + b * x)) ** 2 for x, y in zip(xs, ys))
    se = math.sqrt(resid / (n - 2) / sxx)
    half = t975(n - 2) * se
    return {"n": n, "slope": b, "se": se, "ci95": [b - half, b + half], "intercept": a}


def welch_t(a: list[float], b: list[float]) -> float:
    if len(a) < 2 or len(b) < 2:
        return 0.0
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return math.inf if statistics.fmean(b) != statistics.fmean(a) else 0.0
    return (statistics.fmean(b) - statistics.fmean(a)) / math.sqrt(va + vb)


# --- sampling ---------------------------------------------------------------------------------------

UNIT_MEMORY = "pdctl_unit_memory_anon_bytes"


def parse_metrics(text: str) -> dict:
    """The API server's RSS and finished requests (all finish reasons, all engines) from one vLLM /metrics."""
    rss, finished = None, 0.0
    for line in text.splitlines():
        if line.startswith("process_resident_memory_bytes"):
            rss = float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:request_success_total"):
            finished += float(line.rsplit(" ", 1)[1])
    return {"api_rss_bytes": rss, "finished": finished}


def unit_memory(text: str, name: str) -> float | None:
    """The instance unit's memory (UNIT_MEMORY with instance_name=name) from one node exporter /metrics."""
    for line in text.splitlines():
        if line.startswith(UNIT_MEMORY + "{") and ('instance_name="%s"' % name) in line.split("}", 1)[0]:
            return float(line.rsplit(" ", 1)[1])
    return None


def _sample(client, instances: list[dict], t0: float) -> dict:
    import httpx

    row = {"t": round(time.monotonic() - t0, 3), "instances": {}}
    pages = {}  # one node exporter read per host and sample
    for inst in instances:
        try:
            m = parse_metrics(client.get(inst["url"].rstrip("/") + "/metrics", timeout=10).text)
            if inst["memory_url"] not in pages:
                pages[inst["memory_url"]] = client.get(inst["memory_url"], timeout=10).text
            m["rss_bytes"] = unit_memory(pages[inst["memory_url"]], inst["name"])
        except httpx.HTTPError as exc:
            m = {"rss_bytes": None, "api_rss_bytes": None, "finished": None, "error": str(exc)}
        row["instances"][inst["name"]] = m
    return row


def _verify(cfg: dict):
    """The front door's CA (its certificate is the deployment's own), else the system's trust."""
    return cfg.get("ca_file") or True


def _load(url: str, cfg: dict, model: str, stop: threading.Event, t0: float, out: list, lock: threading.Lock):
    import httpx

    headers = {"Authorization": "Bearer %s" % cfg["api_key"]} if cfg.get("api_key") else {}
    body = {"model": model, "messages": [{"role": "user", "content": cfg["prompt"]}],
            "max_tokens": int(cfg["max_tokens"]), "stream": False}
    with httpx.Client(timeout=float(cfg["request_timeout_s"]), headers=headers, verify=_verify(cfg)) as client:
        while not stop.is_set():
            start = time.monotonic()
            try:
                resp = client.post(url.rstrip("/") + "/v1/chat/completions", json=body)
                answer = resp.json() if resp.status_code == 200 else None
                kind = outcome.of_response(resp.status_code, answer, int(cfg["max_tokens"]))
            except (httpx.HTTPError, ValueError):
                kind = "status"
            with lock:
                out.append({"t": round(start - t0, 3), "latency_s": time.monotonic() - start, "ok": kind is None,
                            "kind": kind})


def run(router_url: str, instances: list[dict], cfg: dict | None = None) -> dict:
    """Run the soak against ``router_url``; ``instances`` are ``{"name", "url", "memory_url"}``: the instance's
    /metrics (finished requests) and its host's node exporter /metrics (the unit's memory) are sampled."""
    # Imported here: the collection's plugins load without the gates' client libraries (ansible-test import).
    import httpx

    cfg = settings(cfg)
    if not instances:
        raise SoakError("no instances to sample")
    lacking = [i["name"] for i in instances if not i.get("memory_url")]
    if lacking:
        raise SoakError("no node exporter URL (memory_url) for %s: the unit's memory is read there" % ", ".join(lacking))
    headers = {"Authorization": "Bearer %s" % cfg["api_key"]} if cfg.get("api_key") else {}
    with httpx.Client(timeout=10, headers=headers, verify=_verify(cfg)) as client:
        try:
            model = cfg["model"] or client.get(router_url.rstrip("/") + "/v1/models").json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise SoakError("cannot read the served model at %s: %s" % (router_url, exc)) from exc
    t0 = time.monotonic()
    stop, lock, requests = threading.Event(), threading.Lock(), []
    workers = [threading.Thread(target=_load, args=(router_url, cfg, model, stop, t0, requests, lock), daemon=True)
               for _worker in range(int(cfg["concurrency"]))]
    for w in workers:
        w.start()
    samples = []
    with httpx.Client(timeout=10) as client:
        next_at = t0
        while time.monotonic() - t0 < float(cfg["duration_s"]):
            samples.append(_sample(client, instances, t0))
            next_at += float(cfg["sample_interval_s"])
            time.sleep(max(0.0, next_at - time.monotonic()))
        stop.set()
        for w in workers:
            w.join(float(cfg["request_timeout_s"]))
        samples.append(_sample(client, instances, t0))
    return evaluate(router_url, model, cfg, instances, samples, requests, wall_s=time.monotonic() - t0)


def evaluate(router_url, model, cfg, instances, samples, requests, wall_s=None) -> dict:
    """The verdict from the samples and the client's request log (pure: tested without a deployment)."""
    warm = float(cfg["warmup_s"])
    limit = float(cfg["max_rss_slope_mb_per_1k"])
    failures, per_instance = [], {}
    for inst in instances:
        name = inst["name"]
        pts = [(s["instances"][name]["finished"], s["instances"][name]["rss_bytes"]) for s in samples
               if s["t"] >= warm and s["instances"][name].get("rss_bytes") is not None]
        fit = linear_fit([f / 1000.0 for f, _rss in pts], [r / 2**20 for _done, r in pts])
        served = (pts[-1][0] - pts[0][0]) if pts else 0
        rss = [r for _done, r in pts]
        leak = (fit["slope"] is not None and fit["slope"] > limit and fit["ci95"][0] > 0)
        api = [(s["instances"][name]["finished"], s["instances"][name]["api_rss_bytes"]) for s in samples
               if s["t"] >= warm and s["instances"][name].get("api_rss_bytes") is not None]
        api_fit = linear_fit([f / 1000.0 for f, _rss in api], [r / 2**20 for _done, r in api])
        per_instance[name] = {"url": inst["url"], "memory_url": inst.get("memory_url"), "memory": UNIT_MEMORY,
                              "samples": len(pts), "requests_served": served,
                              "api_server_rss_slope_mb_per_1k": api_fit["slope"],
                              "rss_start_mb": rss[0] / 2**20 if rss else None,
                              "rss_end_mb": rss[-1] / 2**20 if rss else None,
                              "rss_slope_mb_per_1k": fit["slope"], "rss_slope_se": fit["se"],
                              "rss_slope_ci95": fit["ci95"], "rss_fit_intercept_mb": fit["intercept"],
                              "passed": not leak}
        if leak:
            failures.append("%s: RSS grows %.1f MB per 1,000 requests (API server and engine cores; 95%% CI %.1f "
                            "to %.1f) > limit %g (%.0f -> %.0f MB over %d requests)" % (
                                name, fit["slope"], fit["ci95"][0], fit["ci95"][1], limit,
                                per_instance[name]["rss_start_mb"], per_instance[name]["rss_end_mb"], served))
        elif fit["slope"] is None:
            failures.append("%s: too few RSS samples after the warm-up (%d) to fit a slope (%s at %s: is "
                            "pdctl-unit-memory running on its host?)" % (name, len(pts), UNIT_MEMORY,
                                                                         inst.get("memory_url")))
    done = [r for r in requests if r["t"] >= warm]
    failed = [r for r in requests if not r["ok"]]
    if failed:
        failures.append("%d of %d requests failed" % (len(failed), len(requests)))
    ok = [r for r in done if r["ok"]]
    span = float(cfg["duration_s"]) - warm
    first = [r["latency_s"] for r in ok if r["t"] < warm + span / 3]
    last = [r["latency_s"] for r in ok if r["t"] >= warm + 2 * span / 3]
    drift = None
    if first and last:
        m1, m3 = statistics.fmean(first), statistics.fmean(last)
        drift = {"first_third_mean_s": m1, "last_third_mean_s": m3, "relative": m3 / m1 - 1 if m1 else None,
                 "welch_t": welch_t(first, last), "n_first": len(first), "n_last": len(last)}
        if drift["relative"] is not None and drift["relative"] > float(cfg["max_latency_drift"]) \
                and drift["welch_t"] > 3:
            failures.append("latency drift: mean request latency %.3f s in the last third vs %.3f s in the first "
                            "(+%.0f%% > %.0f%%, t=%.1f)" % (m3, m1, 100 * drift["relative"],
                                                            100 * float(cfg["max_latency_drift"]), drift["welch_t"]))
    settings_out = {k: v for k, v in cfg.items() if k != "api_key"}
    return {"gate": "soak", "passed": not failures, "failures": failures, "router_url": router_url, "model": model,
            "settings": settings_out, "wall_s": round(wall_s, 1) if wall_s is not None else None,
            "requests": {"total": len(requests), "failed": len(failed),
                         "failed_by_kind": outcome.count_kinds(r.get("kind", "status") for r in failed),
                         "per_s": len(requests) / wall_s if wall_s else None},
            "latency_drift": drift, "instances": per_instance, "samples": samples,
            "request_log": [[r["t"], round(r["latency_s"], 4), r["ok"]] for r in requests]}
