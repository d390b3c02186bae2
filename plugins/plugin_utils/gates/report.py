"""Gate reports: JSON (machine-readable), Markdown (for people), PNG plots (matplotlib, Agg backend).

Layout: ``<artifacts>/`` (default ``artifacts/gates/<UTC timestamp>/``) holds
``accuracy.json``, ``accuracy.md``, ``accuracy_items.jsonl`` (per item: ids/hashes, extracted answer, verdict;
GPQA items by id and hash only), ``accuracy.png``; ``sla.json``, ``sla.md``, ``sla_context.png`` (mean TTFT and
TPOT vs context length, with the limits), ``sla_concurrency.png`` (vs concurrency, from the capacity search),
and the benchmark client's own saved results and logs under ``bench/``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path


def default_dir(root="artifacts/gates") -> Path:
    return Path(root) / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _write_json(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)
    return path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# --- accuracy -------------------------------------------------------------------------------------

def write_accuracy(outdir, report: dict, results: list[dict]) -> dict:
    outdir = Path(outdir)
    files = {"json": _write_json(outdir / "accuracy.json", report)}
    items = outdir / "accuracy_items.jsonl"
    with open(items, "w") as fh:
        for row in results:
            fh.write(json.dumps(row, sort_keys=True) + "\n")
    files["items"] = items
    files["markdown"] = outdir / "accuracy.md"
    files["markdown"].write_text(accuracy_markdown(report))
    files["plot"] = accuracy_plot(outdir / "accuracy.png", report)
    report["files"] = {k: str(v) for k, v in files.items()}
    _write_json(outdir / "accuracy.json", report)
    return report["files"]


def accuracy_markdown(report: dict) -> str:
    lines = ["# Accuracy gate: %s" % ("PASSED" if report["passed"] else "FAILED"), "",
             "Router %s, model `%s`, wall time %s s." % (report["router_url"], report["model"], report["wall_s"]),
             "", "| benchmark | correct | accuracy (95% CI) | floor | reference | parse rate | truncated | "
             "errors/timeouts | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for name, b in report["benchmarks"].items():
        ci = b.get("ci95") or (0, 0)
        ref = b.get("reference")
        ref_text = "%d/%d (need %d)" % (ref["correct"], ref["samples"], ref["min_passing"]) if ref else "-"
        lines.append("| %s | %d/%d | %.1f%% (%.1f-%.1f) | %d | %s | %.1f%% | %.1f%% | %d/%d | %s |" % (
            name, b["correct"], b["samples"], 100 * b["accuracy"], 100 * ci[0], 100 * ci[1], b["floor"], ref_text,
            100 * b["parse_rate"], 100 * b["truncation_rate"], b["errors"], b["timeouts"],
            "pass" if b["passed"] else "FAIL"))
    if report.get("failures"):
        lines += ["", "## Failures", ""] + ["- %s" % f for f in report["failures"]]
    lines += ["", "## Data", ""]
    for name, prov in report.get("datasets", {}).items():
        where = ("revision %s" % prov["revision"]) if prov.get("revision") else "local %s" % prov.get("local_dir")
        files = ", ".join("%s sha256 %s" % (f, h[:16]) for f, h in prov["files"].items())
        lines.append("- %s: %s %s, %d items, seed %s; %s" % (name, prov["repo_id"], where, prov["items"],
                                                             prov["seed"], files))
    return "\n".join(lines) + "\n"


def accuracy_plot(path: Path, report: dict) -> Path:
    plt = _pyplot()
    names = list(report["benchmarks"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    accs = [100 * report["benchmarks"][n]["accuracy"] for n in names]
    floors = [100 * report["benchmarks"][n]["floor"] / max(1, report["benchmarks"][n]["samples"]) for n in names]
    colors = ["tab:green" if report["benchmarks"][n]["passed"] else "tab:red" for n in names]
    ax.bar(names, accs, color=colors)
    ax.scatter(names, floors, marker="_", s=900, color="black", label="floor", zorder=3)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Accuracy gate")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# --- SLA ------------------------------------------------------------------------------------------

def write_sla(outdir, report: dict) -> dict:
    outdir = Path(outdir)
    files = {"json": outdir / "sla.json", "markdown": outdir / "sla.md"}
    _write_json(files["json"], report)
    files["markdown"].write_text(sla_markdown(report))
    if report.get("runs"):
        files["plot_context"] = sla_context_plot(outdir / "sla_context.png", report)
    probes = (report.get("capacity") or {}).get("probes")
    if probes:
        files["plot_concurrency"] = sla_concurrency_plot(outdir / "sla_concurrency.png", report)
    report["files"] = {k: str(v) for k, v in files.items()}
    _write_json(files["json"], report)
    return report["files"]


def sla_markdown(report: dict) -> str:
    lim = report["limits"]
    lines = ["# SLA gate: %s" % ("PASSED" if report["passed"] else "FAILED"), "",
             "Router %s; limits mean TTFT <= %g ms, mean TPOT <= %g ms; concurrency %s, output %s tokens; "
             "wall time %s s." % (report["router_url"], lim["max_ttft_ms"], lim["max_tpot_ms"],
                                  report["concurrency"], report["output_len"], report.get("wall_s")),
             "", "| context | requests (failed) | mean TTFT ms (+-SE) | p99 TTFT ms | mean TPOT ms (+-SE) | "
             "p99 TPOT ms | output tok/s | verdict |", "|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append("| %d | %s (%s) | %.0f (+-%.0f) | %s | %.2f (+-%.2f) | %s | %s | %s |" % (
            r["input_len"], r["completed"], r["failed"], r["mean_ttft_ms"], r.get("sem_ttft_ms") or 0,
            _fmt(r.get("p99_ttft_ms"), "%.0f"), r["mean_tpot_ms"], r.get("sem_tpot_ms") or 0,
            _fmt(r.get("p99_tpot_ms"), "%.2f"), _fmt(r.get("output_throughput"), "%.0f"),
            "pass" if r["passed"] else "FAIL"))
    for u in report.get("unmeasured") or []:
        lines.append("| %d | not measured: the client failed twice | - | - | - | - | - | FAIL |" % u["input_len"])
    cap = report.get("capacity")
    if cap:
        lines += ["", "## SLA capacity", "",
                  "Highest concurrency meeting both limits: **%d**%s (per context: %s). Use it as the router's "
                  "admission limit (`--max-concurrent-requests %d`)." % (
                      cap["max_concurrency"], " (the search maximum)" if cap["bounded_by_max"] else "",
                      ", ".join("%s: %s" % kv for kv in cap["per_context"].items()), cap["max_concurrency"]),
                  "", "| context | concurrency | mean TTFT ms | mean TPOT ms | verdict |", "|---|---|---|---|---|"]
        for p in sorted(cap["probes"], key=lambda p: (p["input_len"], p["concurrency"])):
            lines.append("| %d | %d | %.0f | %.2f | %s |" % (p["input_len"], p["concurrency"], p["mean_ttft_ms"],
                                                             p["mean_tpot_ms"], "pass" if p["passed"] else "fail"))
    if report.get("failures"):
        lines += ["", "## Failures", ""] + ["- %s" % f for f in report["failures"]]
    return "\n".join(lines) + "\n"


def _fmt(value, pattern):
    return pattern % value if isinstance(value, (int, float)) else "-"


def sla_context_plot(path: Path, report: dict) -> Path:
    plt = _pyplot()
    runs = sorted(report["runs"], key=lambda r: r["input_len"])
    ctx = [r["input_len"] / 1024 for r in runs]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
    _series(a1, ctx, [r["mean_ttft_ms"] for r in runs], [r.get("sem_ttft_ms") for r in runs],
            report["limits"]["max_ttft_ms"], "mean TTFT (ms)")
    _series(a2, ctx, [r["mean_tpot_ms"] for r in runs], [r.get("sem_tpot_ms") for r in runs],
            report["limits"]["max_tpot_ms"], "mean TPOT (ms)")
    for ax in (a1, a2):
        ax.set_xlabel("input tokens (K)")
    fig.suptitle("SLA gate at concurrency %s" % report["concurrency"])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def sla_concurrency_plot(path: Path, report: dict) -> Path:
    plt = _pyplot()
    probes = report["capacity"]["probes"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
    for ctx in sorted({p["input_len"] for p in probes}):
        pts = sorted((p for p in probes if p["input_len"] == ctx), key=lambda p: p["concurrency"])
        conc = [p["concurrency"] for p in pts]
        a1.plot(conc, [p["mean_ttft_ms"] for p in pts], marker="o", label="%dK" % (ctx // 1024))
        a2.plot(conc, [p["mean_tpot_ms"] for p in pts], marker="o", label="%dK" % (ctx // 1024))
    a1.axhline(report["limits"]["max_ttft_ms"], color="red", linestyle="--", label="limit")
    a2.axhline(report["limits"]["max_tpot_ms"], color="red", linestyle="--", label="limit")
    a1.set_ylabel("mean TTFT (ms)")
    a2.set_ylabel("mean TPOT (ms)")
    for ax in (a1, a2):
        ax.set_xlabel("max concurrency")
        ax.set_xscale("log", base=2)
        ax.legend()
    fig.suptitle("SLA capacity: %d" % report["capacity"]["max_concurrency"])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _series(ax, x, y, err, limit, label):
    ax.errorbar(x, y, yerr=[e or 0 for e in err], marker="o", capsize=3)
    ax.axhline(limit, color="red", linestyle="--", label="limit")
    ax.set_ylabel(label)
    ax.set_ylim(bottom=0)
    ax.legend()


# --- soak -----------------------------------------------------------------------------------------

def write_soak(outdir, report: dict) -> dict:
    outdir = Path(outdir)
    files = {"json": outdir / "soak.json", "markdown": outdir / "soak.md"}
    _write_json(files["json"], report)
    files["markdown"].write_text(soak_markdown(report))
    files["plot"] = soak_plot(outdir / "soak.png", report)
    report["files"] = {k: str(v) for k, v in files.items()}
    _write_json(files["json"], report)
    return report["files"]


def soak_markdown(report: dict) -> str:
    s = report["settings"]
    lines = ["# Soak gate: %s" % ("PASSED" if report["passed"] else "FAILED"), "",
             "Router %s, model `%s`; %s s of steady load (warm-up %s s excluded) at concurrency %s; %d requests "
             "(%d failed); RSS limit %g MB per 1,000 requests, latency drift limit %.0f%%." % (
                 report["router_url"], report["model"], s["duration_s"], s["warmup_s"], s["concurrency"],
                 report["requests"]["total"], report["requests"]["failed"], s["max_rss_slope_mb_per_1k"],
                 100 * s["max_latency_drift"]),
             "", "| instance | requests served | RSS start -> end MB | slope MB / 1k requests (95% CI) | verdict |",
             "|---|---|---|---|---|"]
    for name, i in report["instances"].items():
        slope = ("%.2f (%.2f to %.2f)" % (i["rss_slope_mb_per_1k"], *i["rss_slope_ci95"])
                 if i["rss_slope_mb_per_1k"] is not None else "-")
        lines.append("| %s | %d | %s -> %s | %s | %s |" % (
            name, i["requests_served"], _fmt(i["rss_start_mb"], "%.0f"), _fmt(i["rss_end_mb"], "%.0f"), slope,
            "pass" if i["passed"] else "FAIL"))
    d = report.get("latency_drift")
    if d:
        lines += ["", "Request latency: first third %.3f s (n=%d), last third %.3f s (n=%d): %+.1f%%, Welch t %.1f." % (
            d["first_third_mean_s"], d["n_first"], d["last_third_mean_s"], d["n_last"], 100 * (d["relative"] or 0),
            d["welch_t"])]
    if report.get("failures"):
        lines += ["", "## Failures", ""] + ["- %s" % f for f in report["failures"]]
    return "\n".join(lines) + "\n"


def soak_plot(path: Path, report: dict) -> Path:
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, inst in report["instances"].items():
        pts = [(s["instances"][name]["finished"], s["instances"][name]["rss_bytes"]) for s in report["samples"]
               if s["instances"][name].get("rss_bytes") is not None]
        if not pts:
            continue
        xs = [f / 1000 for f, _rss in pts]
        line, = ax1.plot(xs, [r / 2**20 for _done, r in pts], ".", label="%s%s" % (name, "" if inst["passed"] else " (FAIL)"))
        if inst["rss_slope_mb_per_1k"] is not None:
            fit = report["instances"][name]
            ends = [min(xs), max(xs)]
            ax1.plot(ends, [fit["rss_fit_intercept_mb"] + fit["rss_slope_mb_per_1k"] * x for x in ends], "-",
                     color=line.get_color(), alpha=0.6)
    ax1.set_xlabel("requests finished by the instance (thousands)")
    ax1.set_ylabel("RSS (MB)")
    ax1.set_title("RSS vs requests (slope: MB per 1,000)")
    ax1.legend(fontsize=7)
    log = report.get("request_log") or []
    if log:
        ax2.plot([r[0] for r in log], [1000 * r[1] for r in log], ".", markersize=2, alpha=0.5)
    ax2.axvline(report["settings"]["warmup_s"], color="grey", linestyle=":", label="end of warm-up")
    ax2.set_xlabel("time (s)")
    ax2.set_ylabel("request latency (ms)")
    ax2.set_title("Latency over the soak")
    ax2.legend(fontsize=7)
    fig.suptitle("Soak gate: %s" % ("passed" if report["passed"] else "FAILED"))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
