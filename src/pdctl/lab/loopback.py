"""Stand-ins on loopback (no podman), for the engine tests and benchmarks: start stand-ins with the
recipe's argv, the real vllm-router, and the real `vllm-rs bench serve` client."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml


PREFILL_ARGS = [
    "--trust-remote-code",
    "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}',
    "--chat-template-content-format=string", "-ep", "-tp", "1", "-dp", "4",
    "--tool-call-parser", "glm47", "--enable-auto-tool-choice", "--reasoning-parser", "glm45",
    "--gpu-memory-utilization", "0.92", "--enable-prompt-tokens-details",
    '--speculative-config={"method":"mtp","num_speculative_tokens":1}',
    "--shutdown-timeout", "300", "--fingerprint-mode=none",
]
DECODE_ARGS = [
    "--trust-remote-code", "--chat-template-content-format=string",
    "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}',
    "--compilation-config", '{"cudagraph_mode":"FULL_DECODE_ONLY"}', "--max-num-batched-tokens", "1024",
    "-ep", "-tp", "1", "-dp", "8", "--tool-call-parser", "glm47", "--enable-auto-tool-choice",
    "--reasoning-parser", "glm45", "--gpu-memory-utilization", "0.90", "--enable-prompt-tokens-details",
    "--all2all-backend=flashinfer_nvlink_two_sided",
    '--speculative-config={"method":"mtp","num_speculative_tokens":3}',
    "--shutdown-timeout", "300", "--fingerprint-mode=none",
]
# A colocated single instance: the decode command without the KV connector.
SINGLE_ARGS = DECODE_ARGS[:2] + DECODE_ARGS[4:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_range(n: int) -> int:
    """A base port with n free consecutive ports after it."""
    for _ in range(100):
        base = free_port()
        if base + n < 65000 and all(_free(base + i) for i in range(n)):
            return base
    raise RuntimeError("no free port range")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def write_profile(path: Path, latency=None, answers=None, faults=None) -> Path:
    data = {"latency": latency or {}, "answers": answers or {}, "faults": faults or {}}
    path.write_text(yaml.safe_dump(data))
    return path


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def http_post(url: str, body: dict, timeout: float = 60.0, headers=None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Proc:
    def __init__(self, cmd, env, log_path: Path, url: str | None = None):
        self.log_path = log_path
        self.url = url
        self.log = open(log_path, "wb")
        self.p = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, path="/health", timeout=30.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"exited {self.p.returncode}: {self.log_path.read_text()[-2000:]}")
            try:
                if http_get(self.url + path, timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.url} not ready after {timeout}s: {self.log_path.read_text()[-2000:]}")

    def stop(self, sig=signal.SIGTERM, timeout=15.0) -> int:
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()
        return self.p.returncode

    def metrics(self) -> str:
        return http_get(self.url + "/metrics")[1]


def start_engine(model_dir, args, profile: Path, log_dir: Path, name: str, side_port: int | None = None,
                 extra_env=None, wait=True) -> Proc:
    port = free_port()
    env = dict(os.environ, PDCTL_ENGINE_PROFILE=str(profile), VLLM_USE_V2_MODEL_RUNNER="1",
               VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1",
               VLLM_NIXL_SIDE_CHANNEL_PORT=str(side_port or free_range(8)))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "pdctl.lab.engine", "serve", str(model_dir), *args,
           "--host", "127.0.0.1", "--port", str(port), "--data-parallel-rpc-port", str(free_port())]
    proc = Proc(cmd, env, log_dir / f"{name}.log", f"http://127.0.0.1:{port}")
    if wait:
        proc.wait_ready()
    return proc


def start_router(router_bin, prefills, decodes, log_dir: Path) -> Proc:
    port = free_port()
    cmd = [str(router_bin), "--vllm-pd-disaggregation", "--kv-connector", "nixl", "--host", "127.0.0.1",
           "--port", str(port), "--prometheus-port", str(free_port())]
    for p in prefills:
        cmd += ["--prefill", p.url]
    for d in decodes:
        cmd += ["--decode", d.url]
    proc = Proc(cmd, dict(os.environ), log_dir / "router.log", f"http://127.0.0.1:{port}")
    proc.wait_ready("/health", timeout=60)
    return proc


def bench(vllm_rs, url, model_dir, out_dir: Path, name: str, backend="openai-chat", concurrency=1,
          num_prompts=8, input_len=2000, output_len=128, timeout=600) -> dict:
    endpoint = "/v1/chat/completions" if backend == "openai-chat" else "/v1/completions"
    cmd = [str(vllm_rs), "bench", "serve", "--backend", backend, "--base-url", url, "--endpoint", endpoint,
           "--model", str(model_dir), "--tokenizer", str(model_dir), "--dataset-name", "random",
           "--random-input-len", str(input_len), "--random-output-len", str(output_len),
           "--random-range-ratio", "0", "--ignore-eos", "--num-prompts", str(num_prompts),
           "--max-concurrency", str(concurrency), "--save-result", "--result-dir", str(out_dir),
           "--result-filename", f"{name}.json", "--disable-tqdm"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    (out_dir / f"{name}.out").write_text(res.stdout + res.stderr)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads((out_dir / f"{name}.json").read_text())


def metric_values(text: str, name: str) -> list[float]:
    """All sample values of one series name (any labels) in a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            out.append(float(line.rsplit(" ", 1)[1]))
    return out
