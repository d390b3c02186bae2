"""`pdctl gate accuracy|sla`: run a rollout gate against the router of an inventory's deployment.

The URL is the front door's, from the planner (``pdctl.inventory.plan(inventory)["frontdoor"]["url"]``); the gate's
settings from the inventory variables ``pdctl_gate_accuracy`` / ``pdctl_gate_sla`` (group_vars/all), then a
``--config`` YAML file, then the command-line options. The Hub token is read from the environment
(``HF_TOKEN`` by default), never from the command line.

Exit status: 0 the gate passed, 1 the gate failed (the report says why), 2 invalid input or the gate could
not run.
"""
from __future__ import annotations

import os
import sys
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import topology

EXIT_FAILED = 1
EXIT_INVALID = 2


def add_parser(sub):
    p = sub.add_parser("gate", help="rollout gates: accuracy smoke test, SLA latency gate, soak (RSS leak, latency drift)")
    gsub = p.add_subparsers(dest="gate", required=True)

    a = gsub.add_parser("accuracy", help="AIME 2025 / GPQA Diamond / LongBench v2 smoke test through the router")
    _common(a)
    a.add_argument("--benchmarks", help="comma-separated subset of aime,gpqa,longbench")
    a.add_argument("--local-dir", help="air-gapped: data set files under DIR/<repo_id>/<path>")
    a.add_argument("--cache-dir", help="where Hub downloads are kept (default ~/.cache/pdctl/datasets)")
    a.add_argument("--reference", help="accuracy.json of a known-good deployment (enables the drop test)")
    a.add_argument("--samples", action="append", default=[], metavar="NAME=N",
                   help="items per benchmark, e.g. gpqa=64 (repeatable)")
    a.add_argument("--concurrency", type=int)
    a.add_argument("--time-budget", type=float, dest="time_budget_s", help="seconds for all requests")
    a.add_argument("--seed", type=int)
    a.add_argument("--hf-token-env", default="HF_TOKEN", help="environment variable holding the Hub token")
    _client_auth(a)
    a.set_defaults(func=_run_accuracy)

    s = gsub.add_parser("sla", help="vllm bench serve per context length against the SLA; capacity search")
    _common(s)
    s.add_argument("--contexts", help="comma-separated input lengths, e.g. 16384,65536,131072,262144")
    s.add_argument("--output-len", type=int)
    s.add_argument("--concurrency", type=int)
    s.add_argument("--num-prompts", type=int)
    s.add_argument("--max-ttft-ms", type=float)
    s.add_argument("--max-tpot-ms", type=float)
    s.add_argument("--client", help="benchmark command, default 'vllm bench serve'")
    s.add_argument("--vllm-rs", help="path of the vllm-rs binary (lab); same as --client 'PATH bench serve'")
    s.add_argument("--exec-prefix", help="run the client elsewhere, e.g. 'ssh decode-0'")
    s.add_argument("--tokenizer", help="tokenizer path or name for the client")
    s.add_argument("--capacity", action="store_true", help="also search the SLA capacity")
    s.add_argument("--capacity-max", type=int)
    _client_auth(s)
    s.set_defaults(func=_run_sla)

    k = gsub.add_parser("soak", help="steady load for a while: RSS slope per 1,000 requests and latency drift")
    _common(k)
    k.add_argument("--instance", action="append", default=[], metavar="NAME=URL,NODE_EXPORTER_URL",
                   help="an instance whose /metrics (requests) and whose host's node exporter /metrics (the unit's "
                        "memory) are sampled (repeatable; default: every planned instance)")
    k.add_argument("--duration", type=float, dest="duration_s", help="seconds of load (default 180)")
    k.add_argument("--warmup", type=float, dest="warmup_s", help="seconds excluded from the fits (default 20)")
    k.add_argument("--concurrency", type=int)
    k.add_argument("--sample-interval", type=float, dest="sample_interval_s")
    k.add_argument("--max-rss-slope", type=float, dest="max_rss_slope_mb_per_1k", help="MB per 1,000 requests")
    k.add_argument("--max-latency-drift", type=float, help="relative growth, e.g. 0.25")
    _client_auth(k)
    k.set_defaults(func=_run_soak)


def _common(p):
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("-i", "--inventory", help="inventory whose router is gated")
    where.add_argument("--router-url", help="gate this URL instead of the inventory's router")
    p.add_argument("--config", help="YAML file with the gate's settings")
    p.add_argument("--model", help="served model name (default: the first of /v1/models)")
    p.add_argument("--artifacts", help="report directory (default artifacts/gates/<timestamp>)")


def _client_auth(p):
    p.add_argument("--api-key-env", default="PDCTL_API_KEY",
                   help="environment variable holding a front-door client's key (never on the command line)")
    p.add_argument("--ca-file", help="CA that signed the front door's certificate (default the inventory's "
                                     "pdctl_frontdoor_ca_file)")


def _apply_client_auth(args, cfg: dict, sla_env: bool = False) -> None:
    """The client key (from the environment) and the front door's CA into a gate's settings."""
    ca_file = args.ca_file
    if not ca_file and args.inventory:
        from pdctl import inventory

        hosts = inventory.load(args.inventory, names=("pdctl_frontdoor_ca_file",))
        ca_file = next((h["vars"]["pdctl_frontdoor_ca_file"] for h in hosts.values()
                        if h["vars"].get("pdctl_frontdoor_ca_file")), None)
    key = os.environ.get(args.api_key_env)
    if sla_env:
        env = dict(cfg.get("env") or {})
        if key:
            env["OPENAI_API_KEY"] = key
        if ca_file:
            env["SSL_CERT_FILE"] = ca_file
        cfg["env"] = env
    else:
        if key:
            cfg["api_key"] = key
        if ca_file:
            cfg["ca_file"] = ca_file


def _settings(args, var: str) -> tuple[str, dict]:
    """(router URL, settings) from the inventory/planner, the --config file and --router-url."""
    import yaml

    settings, url = {}, args.router_url
    if args.inventory:
        from pdctl import inventory

        hosts = inventory.load(args.inventory)
        for host in sorted(hosts):
            value = hosts[host]["vars"].get(var)
            if isinstance(value, dict):
                settings = dict(value)
                break
        url = url or inventory.plan(args.inventory)["frontdoor"]["url"]
    if args.config:
        with open(args.config) as fh:
            settings.update(yaml.safe_load(fh) or {})
    return url, settings


def _input_errors() -> tuple:
    """Errors that mean bad input or an unreachable deployment: reported in one line, exit status 2."""
    import openai

    from pdctl import inventory

    return (ValueError, OSError, openai.APIError, inventory.InventoryError,
            topology.PlanError)


def _outdir(args):
    from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import report

    return args.artifacts or str(report.default_dir())


def _run_accuracy(args) -> int:
    from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import accuracy, datasets, report

    try:
        url, cfg = _settings(args, "pdctl_gate_accuracy")
        if args.benchmarks:
            cfg["benchmarks"] = [b.strip() for b in args.benchmarks.split(",") if b.strip()]
        for key in ("local_dir", "cache_dir", "concurrency", "time_budget_s", "seed"):
            if getattr(args, key) is not None:
                cfg[key] = getattr(args, key)
        for spec in args.samples:
            name, _, n = spec.partition("=")
            cfg.setdefault(name, {})["samples"] = int(n)
        if not cfg.get("local_dir") and not cfg.get("cache_dir"):
            from pdctl import cache

            cfg["cache_dir"] = str(cache.cache_dir("datasets"))  # Hub downloads: pdctl's cache
        _apply_client_auth(args, cfg)
        reference = accuracy.load_reference(args.reference) if args.reference else None
        result, rows = accuracy.run(url, cfg, model=args.model, token=os.environ.get(args.hf_token_env) or None,
                                    reference=reference)
    except _input_errors() + (datasets.DatasetError,) as exc:
        print("pdctl gate accuracy: %s" % (exc or type(exc).__name__), file=sys.stderr)
        return EXIT_INVALID
    outdir = _outdir(args)
    files = report.write_accuracy(outdir, result, rows)
    for name, b in result["benchmarks"].items():
        print("%-9s %3d/%-3d correct (%.1f%%), floor %d, parse %.0f%%, truncated %.0f%%: %s" % (
            name, b["correct"], b["samples"], 100 * b["accuracy"], b["floor"], 100 * b["parse_rate"],
            100 * b["truncation_rate"], "pass" if b["passed"] else "FAIL"))
    for failure in result["failures"]:
        print("  - %s" % failure, file=sys.stderr)
    print("report: %s" % files["markdown"])
    return 0 if result["passed"] else EXIT_FAILED


def _run_sla(args) -> int:
    from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import report, sla

    try:
        url, cfg = _settings(args, "pdctl_gate_sla")
        if args.contexts:
            cfg["contexts"] = [int(c) for c in args.contexts.split(",") if c.strip()]
        for key in ("output_len", "concurrency", "num_prompts", "max_ttft_ms", "max_tpot_ms", "tokenizer",
                    "model", "exec_prefix", "client"):
            if getattr(args, key, None) is not None:
                cfg[key] = getattr(args, key)
        if args.vllm_rs:
            cfg["client"] = [args.vllm_rs, "bench", "serve"]
        if args.capacity or args.capacity_max:
            cfg.setdefault("capacity", {})["enabled"] = True
            if args.capacity_max:
                cfg["capacity"]["max"] = args.capacity_max
        _apply_client_auth(args, cfg, sla_env=True)
        outdir = _outdir(args)
        result = sla.run(url, cfg, outdir)
    except _input_errors() + (sla.SlaError,) as exc:
        print("pdctl gate sla: %s" % exc, file=sys.stderr)
        return EXIT_INVALID
    files = report.write_sla(outdir, result)
    for r in result["runs"]:
        print("context %7d: mean TTFT %7.0f ms, mean TPOT %6.2f ms, failed %s: %s" % (
            r["input_len"], r["mean_ttft_ms"], r["mean_tpot_ms"], r["failed"], "pass" if r["passed"] else "FAIL"))
    for u in result.get("unmeasured") or []:
        print("context %7d: not measured (the client failed twice): FAIL" % u["input_len"])
    if result.get("capacity"):
        print("SLA capacity: %d concurrent requests" % result["capacity"]["max_concurrency"])
    for failure in result["failures"]:
        print("  - %s" % failure, file=sys.stderr)
    print("report: %s" % files["markdown"])
    return 0 if result["passed"] else EXIT_FAILED


def _run_soak(args) -> int:
    from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import report, soak

    try:
        url, cfg = _settings(args, "pdctl_gate_soak")
        for key in ("duration_s", "warmup_s", "concurrency", "sample_interval_s", "max_rss_slope_mb_per_1k",
                    "max_latency_drift", "model"):
            if getattr(args, key, None) is not None:
                cfg[key] = getattr(args, key)
        _apply_client_auth(args, cfg)
        instances = []
        for spec in args.instance:
            name, _, urls = spec.partition("=")
            inst_url, _, memory_url = urls.partition(",")
            if not inst_url or not memory_url:
                raise ValueError("--instance wants NAME=URL,NODE_EXPORTER_URL, got %r" % spec)
            instances.append({"name": name, "url": inst_url, "memory_url": memory_url})
        if not instances and args.inventory:
            from pdctl import inventory

            hosts = inventory.load(args.inventory, names=["pdctl_monitoring"])
            # The unit's memory: node exporter on the instance's host (roles/monitoring's textfile collector).
            instances = [{"name": i["name"], "url": i["url"],
                          "memory_url": "http://%s:%d/metrics" % (
                              i["address"], hosts[i["host"]]["vars"]["pdctl_monitoring"]["node_exporter_port"])}
                         for i in inventory.plan(args.inventory)["instances"]]
        if not instances:
            raise ValueError("no instances to sample: give -i INVENTORY or --instance NAME=URL")
        result = soak.run(url, instances, cfg)
    except _input_errors() + (soak.SoakError,) as exc:
        print("pdctl gate soak: %s" % exc, file=sys.stderr)
        return EXIT_INVALID
    files = report.write_soak(_outdir(args), result)
    for name, i in result["instances"].items():
        slope = "-" if i["rss_slope_mb_per_1k"] is None else "%.2f MB/1k requests (95%% CI %.2f to %.2f)" % (
            i["rss_slope_mb_per_1k"], *i["rss_slope_ci95"])
        print("%-10s %6d requests, RSS slope %s: %s" % (name, i["requests_served"], slope,
                                                        "pass" if i["passed"] else "FAIL"))
    for failure in result["failures"]:
        print("  - %s" % failure, file=sys.stderr)
    print("report: %s" % files["markdown"])
    return 0 if result["passed"] else EXIT_FAILED


def main(argv=None) -> int:
    """`python -m pdctl.gates.cli accuracy|sla|soak ...` (the same as `pdctl gate ...`)."""
    import argparse

    parser = argparse.ArgumentParser(prog="pdctl")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["gate"] + list(sys.argv[1:] if argv is None else argv))
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
