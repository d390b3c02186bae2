"""The front door on the lab (issue 14, acceptance 1, 3, 4 and the /v1/models part of 6): TLS with the lab CA,
bearer keys per client, a hard in-flight limit with a bounded queue, bad input refused at the door."""
import concurrent.futures
import json
import os
import random
import socket
import ssl
import subprocess
import threading
import time

import httpx
import pytest
import yaml

from conftest import LAB_ENV
from inventories import ROOT
from pdctl import inventory, outcome, runner

pytestmark = [pytest.mark.lab, pytest.mark.slow]

MODEL = "/mnt/model/glm/GLM-5.2-NVFP4"
CA = str(ROOT / ".lab/tls/ca.pem")
FRONTDOOR_HOST = "lab-decode-0"
UNITS = {"lab-decode-0": ["haproxy.service", "pdctl-router.service", "pdctl-vllm-decode-0.service"],
         "lab-prefill-0": ["pdctl-vllm-prefill-0.service", "pdctl-vllm-prefill-1.service"],
         "lab-prefill-1": ["pdctl-vllm-prefill-2.service", "pdctl-vllm-prefill-3.service"]}


def on_host(host, *argv):
    return subprocess.run(["podman", "exec", host, *argv], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def plan(converged_lab):
    return inventory.plan(ROOT / "inventories/lab")


@pytest.fixture(scope="module")
def url(plan):
    assert plan["frontdoor"]["url"] == "https://10.89.64.200:8443"  # the virtual address (issue 39)
    return plan["frontdoor"]["url"]


def clients():
    return {c["name"]: c["key"] for c in yaml.safe_load((ROOT / ".lab/secrets/clients.yml").read_text())}


def auth(name="tester"):
    return {"Authorization": "Bearer " + clients()[name]}


def chat(max_tokens=8, stream=False, **extra):
    return dict({"model": MODEL, "messages": [{"role": "user", "content": "Say something about GPUs."}],
                 "max_tokens": max_tokens, "stream": stream}, **extra)


def local_metrics(host, port):
    """A Prometheus endpoint read on the host itself (the router listens on loopback only)."""
    return on_host(host, "python3", "-c",
                   "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:%d/metrics', timeout=10)"
                   ".read().decode())" % port)


def samples(text, name, **labels):
    """Sum of the samples of metric `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, rest = head.partition("{")
        if metric != name:
            continue
        if all('%s="%s"' % kv in rest for kv in labels.items()):
            total += float(value)
    return total


def haproxy_metrics(plan):
    return local_metrics(FRONTDOOR_HOST, plan["frontdoor"]["metrics_port"])


def router_requests(plan):
    """Requests that reached the routers: HAProxy's count towards them (definitive) and the router's own
    request counters for API routes (its /health is polled by the front door's checks every second)."""
    hap = samples(haproxy_metrics(plan), "haproxy_backend_http_requests_total", proxy="be_routers")
    own = 0.0
    for router in plan["routers"]:
        text = local_metrics(router["host"], router["metrics_port"])
        for line in text.splitlines():
            name = line.split("{")[0].split(" ")[0]
            if (not line.startswith("#") and "request" in name and name.endswith("_total")
                    and any(route in line for route in ("/v1", "chat", "completion", "models"))):
                own += float(line.rpartition(" ")[2])
    return hap, own


def unit_state():
    state = {}
    for host, units in UNITS.items():
        for unit in units:
            state[(host, unit)] = on_host(host, "systemctl", "show", "-p", "MainPID", "-p", "NRestarts",
                                          "--value", unit).split()
    return state


def client(**kw):
    return httpx.Client(verify=CA, timeout=kw.pop("timeout", 60), **kw)


# -- acceptance 1 and 6: TLS, keys, gates ---------------------------------------------------------

def test_models_are_listed_for_an_authenticated_client_over_verified_tls(url):
    with client() as c:
        resp = c.get(url + "/v1/models", headers=auth())
    assert resp.status_code == 200, resp.text
    assert MODEL in [m["id"] for m in resp.json()["data"]]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer not-a-key-of-anyone-1234"},
                                     "revoked", {"Authorization": "Basic dXNlcjpwYXNz"}],
                         ids=["no-key", "wrong-key", "revoked-key", "not-bearer"])
def test_refused_clients_get_401_and_nothing_reaches_the_router(plan, url, headers):
    if headers == "revoked":
        headers = auth("revoked")
    before = router_requests(plan)
    with client() as c:
        for _ in range(5):
            resp = c.post(url + "/v1/chat/completions", json=chat(), headers=headers)
            assert resp.status_code == 401, resp.text
            assert resp.headers["www-authenticate"].startswith("Bearer")
            assert resp.json()["error"]["code"] == 401
            assert c.get(url + "/v1/models", headers=headers).status_code == 401
    assert router_requests(plan) == before


def test_the_log_names_the_client_and_never_the_key(url):
    marker = "/v1/models"
    with client() as c:
        assert c.get(url + marker, headers=auth("tester")).status_code == 200
    time.sleep(1)
    log = on_host(FRONTDOOR_HOST, "journalctl", "-u", "haproxy.service", "--since", "-2min", "--no-pager")
    assert "client=tester" in log
    for key in clients().values():
        assert key not in log


def test_gates_pass_through_the_front_door(converged_lab, lab):
    result = runner.run_playbook("site.yml", lab, tags="gates", extravars={"pdctl_gates_force": True},
                                 envvars=LAB_ENV)
    assert result.ok, "%s\n%s" % (result.recap(), result.failures)
    reports = sorted((ROOT / "artifacts/gates").glob("*/sla.json"), key=lambda p: p.stat().st_mtime)
    assert json.loads(reports[-1].read_text())["router_url"] == "https://10.89.64.200:8443"


# -- acceptance 3: hard in-flight limit ------------------------------------------------------------

N = 3


@pytest.fixture
def small_limit(lab):
    """The front door with N in flight and a queue of N (so 3N streams overflow it), restored after."""
    result = runner.run_playbook("site.yml", lab, tags="frontdoor", envvars=LAB_ENV,
                                 extravars={"pdctl_frontdoor_max_inflight": N, "frontdoor_max_queue": N,
                                            "frontdoor_queue_timeout_s": 60})
    assert result.ok, "%s\n%s" % (result.recap(), result.failures)
    yield N
    restored = runner.run_playbook("site.yml", lab, tags="frontdoor", envvars=LAB_ENV)
    assert restored.ok, "%s\n%s" % (restored.recap(), restored.failures)


def test_never_more_than_n_in_flight_and_the_overflow_gets_503_with_retry_after(plan, url, small_limit):
    n = small_limit
    cfg = on_host(FRONTDOOR_HOST, "cat", "/etc/haproxy/haproxy.cfg")
    assert "maxconn %d maxqueue %d" % (n, n) in cfg
    decode = plan["instances"][[i["pool"] for i in plan["instances"]].index("decode")]
    peak = {"frontdoor": 0, "decode_running": 0}
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            text = haproxy_metrics(plan)
            peak["frontdoor"] = max(peak["frontdoor"], samples(text, "haproxy_server_current_sessions",
                                                               proxy="be_routers"))
            running = samples(local_metrics(decode["host"], decode["api_port"]), "vllm:num_requests_running")
            peak["decode_running"] = max(peak["decode_running"], running)
            time.sleep(0.05)

    def one(i):
        t0 = time.monotonic()
        with client(timeout=120) as c:
            with c.stream("POST", url + "/v1/chat/completions", headers=auth(),
                          json=chat(max_tokens=64, stream=True, ignore_eos=True,
                                    stream_options={"include_usage": True})) as resp:
                body = b"".join(resp.iter_bytes())
                return resp.status_code, resp.headers.get("retry-after"), body, time.monotonic() - t0

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(3 * n) as pool:
            results = list(pool.map(one, range(3 * n), timeout=180))
    finally:
        stop.set()
        watcher.join(10)
    codes = [r[0] for r in results]
    assert set(codes) <= {200, 503}, codes
    assert codes.count(503) >= 1, "3N streams with a queue of N: some must be refused (%s)" % codes
    assert codes.count(200) >= 2 * n - 1, codes   # N in flight + N queued (one may race the queue check)
    for code, retry_after, body, _ in results:
        if code == 503:
            assert retry_after and int(retry_after) > 0
            assert json.loads(body)["error"]["code"] == 503
        else:  # the one outcome rule: [DONE], finish_reason length, all 64 tokens
            reader = outcome.StreamReader()
            for line in body.decode().splitlines():
                reader.feed(line)
            assert b"data: [DONE]" in body and reader.kind(code, 64) is None, body[-300:]
    assert all(r[3] < 120 for r in results), "a request hung"
    assert 0 < peak["frontdoor"] <= n, peak
    assert peak["decode_running"] <= n, peak


# -- acceptance 4: bad input -----------------------------------------------------------------------

def tls_socket(plan, timeout=30):
    ctx = ssl.create_default_context(cafile=CA)
    raw = socket.create_connection((plan["frontdoor"]["addresses"][0], plan["frontdoor"]["port"]), timeout=timeout)
    return ctx.wrap_socket(raw, server_hostname=plan["frontdoor"]["addresses"][0])


def read_status(sock):
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else None


def test_body_over_the_limit_is_413_before_it_is_sent(plan):
    before = router_requests(plan)
    with tls_socket(plan) as sock:
        sock.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: frontdoor\r\nAuthorization: Bearer %s\r\n"
                      "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                      % (clients()["tester"], 9 * 1024 * 1024)).encode())
        assert read_status(sock) == 413
    assert router_requests(plan)[0] == before[0]


def test_a_normal_large_prompt_is_accepted(url):
    """About 1.5 MB of JSON, the size of a 256K-token prompt, is under the limit."""
    body = chat(max_tokens=2)
    body["messages"][0]["content"] = "GPU " * 380000
    with client(timeout=300) as c:
        resp = c.post(url + "/v1/chat/completions", json=body, headers=auth())
    assert resp.status_code != 413
    assert resp.status_code < 500, resp.text


def test_malformed_json_is_a_client_error(url):
    with client() as c:
        resp = c.post(url + "/v1/chat/completions", content=b'{"model": "x", "messages": [', headers=dict(
            auth(), **{"Content-Type": "application/json"}))
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text)


@pytest.mark.parametrize("path", ["/v1/embeddings", "/metrics", "/admin", "/v1/chat/completions/../../etc"])
def test_unknown_paths_are_404_at_the_door(plan, url, path):
    before = router_requests(plan)[0]
    with client() as c:
        assert c.get(url + path, headers=auth()).status_code == 404
        assert c.get(url + path).status_code == 401  # no key: nothing is revealed
    assert router_requests(plan)[0] == before


def test_a_client_that_never_finishes_its_headers_is_cut(plan, url):
    with tls_socket(plan, timeout=60) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: frontdoor\r\n")
        t0 = time.monotonic()
        with client() as c:  # others are served meanwhile
            assert c.post(url + "/v1/chat/completions", json=chat(), headers=auth()).status_code == 200
        status = read_status(sock)
        waited = time.monotonic() - t0
    assert status in (408, None), status  # 408, or the connection closed
    assert waited < 30, "the slow client held its connection for %.0f s" % waited


def test_a_thousand_garbage_requests_break_nothing(plan, url):
    before = unit_state()
    rng = random.Random(14)
    host, port = plan["frontdoor"]["addresses"][0], plan["frontdoor"]["port"]
    ok = {"during": 0}
    stop = threading.Event()

    def garbage(i):
        payload = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4096)))
        try:
            if i % 3 == 0:  # not even TLS
                with socket.create_connection((host, port), timeout=10) as s:
                    s.sendall(payload)
                    s.recv(1024)
            else:           # TLS, then an HTTP-ish or random request
                with tls_socket(plan, timeout=10) as s:
                    if i % 3 == 1:
                        payload = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + payload + b"\r\n\r\n"
                    s.sendall(payload)
                    s.recv(1024)
        except (OSError, ssl.SSLError):
            pass

    def normal():
        with client() as c:
            while not stop.is_set():
                resp = c.post(url + "/v1/chat/completions", json=chat(max_tokens=4), headers=auth())
                assert resp.status_code == 200, resp.text
                ok["during"] += 1

    normal_thread = concurrent.futures.ThreadPoolExecutor(1).submit(normal)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(garbage, range(1000)))
    stop.set()
    normal_thread.result(timeout=120)
    assert ok["during"] > 0
    with client() as c:
        for _ in range(5):
            assert c.post(url + "/v1/chat/completions", json=chat(), headers=auth()).status_code == 200
    assert unit_state() == before, "a unit restarted"
