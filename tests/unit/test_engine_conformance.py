"""The engine stand-in against vLLM 0.33.0's own source (issue 37): each test reads the real wheel (the one the
lab downloads for vllm-rs; no torch, nothing installed) and fails when the stand-in and vLLM disagree.

Covered: which paths need the API key, the routes, /health and new requests while draining, SIGTERM in the
API server and the engine core, the fields of a prefill's kv_transfer_params, the handshake compatibility
rule, kv_load_failure_policy and the KV lease default, metric names and types (the stand-in's and every one
pdctl's rules, dashboards, gates and soak read)."""
from __future__ import annotations

import ast
import asyncio
import json
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from inventories import ROOT
from pdctl.lab import tokenizer as lab_tokenizer
from pdctl.lab import tools
from pdctl.lab.engine import args as engine_args, profile as engine_profile, server
from pdctl.lab.engine.cli import load_model_dir
from pdctl.lab.engine.metrics import EngineMetrics, Metric

KEY = "conformance-key"
PRODUCER = ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}']


@pytest.fixture(scope="module")
def wheel():
    with zipfile.ZipFile(tools.vllm_wheel()) as zf:
        yield zf


def source(wheel, path):
    return wheel.read("vllm/" + path).decode()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return lab_tokenizer.build(tmp_path_factory.mktemp("model"))


def make_engine(model_dir, argv=()):
    a = engine_args.parse([str(model_dir), "--api-key", KEY, *argv])
    tok, template, max_len = load_model_dir(a.model, None)
    return server.Engine(a, engine_profile.load(""), tok, template, max_len)


def ask(model_dir, requests, argv=(), before=None):
    """[(status, body text)] for each (method, path, json body, with key) against the stand-in's app."""
    from aiohttp.test_utils import TestClient, TestServer

    async def go():
        engine = make_engine(model_dir, argv)
        if before:
            before(engine)
        async with TestClient(TestServer(server.build_app(engine))) as client:
            out = []
            for method, path, body, keyed in requests:
                headers = {"Authorization": "Bearer " + KEY} if keyed else {}
                resp = await client.request(method, path, json=body, headers=headers)
                out.append((resp.status, await resp.text()))
            return out
    return asyncio.run(go())


def chat_body(model_dir, **extra):
    return {"model": str(model_dir), "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, **extra}


# ---------------------------------------------------------------- the API key

def test_the_api_key_guards_the_paths_vllm_guards(wheel, model_dir):
    tree = ast.parse(source(wheel, "entrypoints/serve/middleware/authenticate.py"))
    guarded = next(ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                   and any(getattr(t, "id", None) == "GUARDED_PREFIX" for t in n.targets))
    assert server.GUARDED_PREFIX == guarded
    body = chat_body(model_dir)
    out = ask(model_dir, [("POST", "/v1/chat/completions", body, False),
                          ("POST", "/invocations", body, False),
                          ("POST", "/scale_elastic_ep", {"new_data_parallel_size": 1}, False),
                          ("GET", "/metrics", None, False),
                          ("GET", "/health", None, False),
                          ("POST", "/v1/chat/completions", body, True)])
    assert [status for status, _ in out] == [401, 200, 200, 200, 200, 200]
    assert json.loads(out[1][1])["choices"][0]["finish_reason"] == "length"      # /invocations: a chat
    assert json.loads(out[2][1]) == {"message": "Scaled to 1 data parallel engines"}


# ---------------------------------------------------------------- routes

ROUTE = re.compile(r'@(?:router|app)\.(get|post|put|delete|api_route)\(\s*"(/[^"]*)"', re.M)


def vllm_routes(wheel):
    routes = set()
    for name in wheel.namelist():
        if name.startswith("vllm/entrypoints/") and name.endswith(".py"):
            text = wheel.read(name).decode()
            routes |= {(m.group(1).upper(), m.group(2)) for m in ROUTE.finditer(text)}
    return routes


def test_every_route_the_stand_in_serves_is_vllms(wheel, model_dir):
    ours = {(r.method, r.resource.canonical) for r in server.build_app(make_engine(model_dir)).router.routes()
            if r.method != "HEAD"}
    theirs = vllm_routes(wheel)
    # /metrics is mounted (prometheus_client's ASGI app), not declared with a decorator.
    assert "Mount(\"/metrics\"" in source(wheel, "entrypoints/serve/instrumentator/metrics.py").replace("'", '"') \
        or '"/metrics"' in source(wheel, "entrypoints/serve/instrumentator/metrics.py")
    missing = sorted(r for r in ours - theirs if r != ("GET", "/metrics"))
    assert not missing, "the stand-in serves routes vLLM 0.33 does not: %s" % missing
    assert {("POST", "/invocations"), ("POST", "/scale_elastic_ep")} <= ours & theirs


# ---------------------------------------------------------------- draining

def test_while_draining_health_answers_200_and_new_requests_end_with_abort(wheel, model_dir):
    health = source(wheel, "entrypoints/serve/instrumentator/health.py")
    handler = next(n for n in ast.walk(ast.parse(health)) if isinstance(n, ast.AsyncFunctionDef) and n.name == "health")
    # vLLM's /health: 503 only where the engine is dead (EngineDeadError); no middleware knows of a drain
    # (the only 503 middleware pauses serving during an elastic-EP scale).
    assert health.count("status_code=503") == 1
    assert any(isinstance(n, ast.ExceptHandler) and getattr(n.type, "id", None) == "EngineDeadError"
               and "status_code=503" in ast.unparse(n) for n in ast.walk(handler))
    middleware = "".join(source(wheel, "entrypoints/serve/middleware/" + p) for p in (
        "authenticate.py", "x_request_id.py", "log_response.py", "register.py"))
    assert "503" not in middleware and "drain" not in middleware
    scaling = source(wheel, "entrypoints/serve/elastic_ep/middleware.py")
    assert "serving_paused = get_scaling_elastic_ep() or rank_retired" in scaling
    # The HTTP server stops only after the engine client's drain returned; the engine core rejects work
    # added during its shutdown with abort outputs.
    launcher = source(wheel, "entrypoints/launchers/launcher.py")
    assert launcher.index("engine_client.shutdown") < launcher.index("server.should_exit = True")
    core = source(wheel, "v1/engine/core.py")
    reject = core[core.index("def _reject_add_in_shutdown"):]
    assert "_send_abort_outputs_to_client" in reject[:reject.index("\n    def ", 10)]
    assert '"abort"' in source(wheel, "v1/engine/__init__.py")

    # An aborted prefill leg hands over no KV (NixlConnector.request_finished: None unless stopped or capped).
    finished = source(wheel, "distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py")
    assert "RequestStatus.FINISHED_LENGTH_CAPPED,\n            RequestStatus.FINISHED_STOPPED," in finished

    def drain(engine):
        engine.draining = True
    leg = chat_body(model_dir, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    out = ask(model_dir, [("GET", "/health", None, False),
                          ("POST", "/v1/chat/completions", chat_body(model_dir), True),
                          ("POST", "/v1/chat/completions", chat_body(model_dir, stream=True), True),
                          ("POST", "/v1/chat/completions", leg, True)], argv=PRODUCER, before=drain)
    assert out[0][0] == 200
    assert out[1][0] == 200 and json.loads(out[1][1])["choices"][0]["finish_reason"] == "abort"
    assert out[2][0] == 200 and '"finish_reason": "abort"' in out[2][1] and out[2][1].rstrip().endswith("[DONE]")
    assert out[3][0] == 200 and json.loads(out[3][1])["kv_transfer_params"] is None


def test_sigterm_to_an_engine_core_is_a_drain_as_in_vllm(wheel):
    core = source(wheel, "v1/engine/core.py")
    assert "signal.signal(signal.SIGTERM, signal_handler)" in core
    handler = core[core.index("def signal_handler(signum, frame)"):]
    handler = handler[:handler.index("signal.signal(signal.SIGTERM")]
    assert "EngineShutdownState.REQUESTED" in handler and "sys.exit" not in handler and "SystemExit" not in handler
    assert 'mode = "abort" if shutdown_timeout == 0 else "drain"' in core
    # The stand-in's engine core: SIGTERM is reported to its API server (which drains the core's rank); the
    # core lives on until its API server closes the pipe, then exits 0.
    proc = subprocess.Popen([sys.executable, "-c", server.ENGINE_CORE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        caught, deadline = 0, time.monotonic() + 10
        while not caught & (1 << (signal.SIGTERM - 1)) and proc.poll() is None:  # its handler is in place
            assert time.monotonic() < deadline, "the stand-in's engine core catches no SIGTERM (vLLM's drains)"
            status = Path("/proc/%d/status" % proc.pid).read_text()
            caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.M).group(1), 16)
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout.readline() == b"shutdown requested %d\n" % signal.SIGTERM
        assert proc.poll() is None
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        proc.kill()


# ---------------------------------------------------------------- P/D: kv_transfer_params, policy, lease

def test_a_prefills_kv_transfer_params_have_vllms_fields(wheel, model_dir):
    tree = ast.parse(source(wheel, "distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py"))
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "dict"
                and any(k.arg == "do_remote_prefill" for k in n.keywords))
    engine = make_engine(model_dir, PRODUCER)
    params = engine.kv_params_out({"id": "r", "prompt_tokens": 100, "kv_params": {"do_remote_decode": True},
                                   "rank": engine.ranks[0]})
    assert set(params) == {k.arg for k in call.keywords}
    assert params["transfer_mode"] == "pull"


def test_kv_load_failure_policy_and_the_lease_default_are_vllms(wheel, model_dir):
    config = source(wheel, "config/kv_transfer.py")
    assert 'kv_load_failure_policy: Literal["recompute", "fail"] = "fail"' in config
    worker = source(wheel, "distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py")
    assert re.search(r'"kv_lease_duration",\s*30\s*\)', worker)
    engine = make_engine(model_dir, PRODUCER)
    assert engine.load_failure_policy == "fail" and engine.lease_s == 30


def test_the_handshake_compatibility_rule_covers_what_vllms_does_across_releases(wheel):
    """vLLM refuses a peer whose compatibility hash differs (enforce_handshake_compat, on by default); the hash
    covers the vLLM version, the model and the speculative config (what differs between the lab's releases
    and models), not the TP size (checked apart, so heterogeneous TP is allowed). The stand-in's hash moves
    with the same three and nothing else it models."""
    from pdctl.lab.engine import kv

    metadata = source(wheel, "distributed/kv_transfer/kv_connector/v1/nixl/metadata.py")
    body = metadata[metadata.index("def compute_nixl_compatibility_hash"):]
    factors = body[body.index("factors = {"):body.index("compat_hash = hash_factors(factors)")]
    for factor in ('"vllm_version"', '"model"', '"speculative_config"', '"transfer_mode"'):
        assert factor in factors
    assert "tensor_parallel_size" not in factors
    assert re.search(r'"enforce_handshake_compat",\s*True', source(
        wheel, "distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py"))
    base = kv.compat_hash("0.33.0", "/m", "mtp")
    assert len({base, kv.compat_hash("0.34.0", "/m", "mtp"), kv.compat_hash("0.33.0", "/n", "mtp"),
                kv.compat_hash("0.33.0", "/m", "none")}) == 4


# ---------------------------------------------------------------- metrics

KIND = {"_counter_cls": "counter", "_gauge_cls": "gauge", "_histogram_cls": "histogram"}


def vllm_metrics(wheel):
    """{name: kind} of every vllm: metric the wheel registers."""
    out = {}
    pattern = re.compile(r'(_counter_cls|_gauge_cls|_histogram_cls)\(\s*name=\s*"(vllm:[a-z0-9_]+)"')
    for name in wheel.namelist():
        if name.endswith(".py"):
            for cls, metric in pattern.findall(wheel.read(name).decode("utf-8", "replace")):
                out[metric] = KIND[cls]
    # Spec decoding registers its counters from a table of names (all counters: the only class it uses).
    spec = source(wheel, "v1/spec_decode/metrics.py")
    assert "_gauge_cls(" not in spec and "_histogram_cls(" not in spec
    out.update({m: "counter" for m in re.findall(r'"(vllm:spec_decode_[a-z_]+)"', spec)})
    return out


def test_the_stand_ins_metrics_have_vllms_names_and_types(wheel):
    theirs = vllm_metrics(wheel)
    metrics = EngineMetrics("m", 2, True, "kv_consumer", server.RELEASE)
    ours = {m.name: m.kind for m in vars(metrics).values() if isinstance(m, Metric) and m.name.startswith("vllm:")}
    assert len(ours) >= 20
    wrong = {name: (kind, theirs.get(name)) for name, kind in ours.items() if theirs.get(name) != kind}
    assert not wrong, "stand-in metric (kind, vLLM's kind): %s" % wrong


def test_every_vllm_metric_pdctl_reads_exists_in_vllm(wheel):
    theirs = vllm_metrics(wheel)
    read = {}
    for base in ("roles", "src/pdctl/gates", "plugins", "playbooks"):
        for path in (ROOT / base).rglob("*"):
            if path.is_file() and path.suffix in (".yml", ".j2", ".json", ".py", ".yaml"):
                for name in re.findall(r"vllm:[a-z0-9_]+", path.read_text(errors="replace")):
                    read.setdefault(re.sub(r"_(total|bucket|sum|count|created)$", "", name), path.relative_to(ROOT))
    assert read, "no vllm: metric found in the rules, dashboards and gates"
    unknown = {name: str(where) for name, where in read.items() if name not in theirs}
    assert not unknown, "pdctl reads metrics vLLM 0.33 does not export: %s" % unknown
