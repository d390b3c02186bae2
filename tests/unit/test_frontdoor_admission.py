# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""frontdoor_admission against a real HAProxy (the host's, 2.6 on Debian 12) running the front door role's own
haproxy.cfg.j2, rendered here for one router host whose P/D router, decode and aggregated router are one
local HTTP server that holds each request until the test lets it go. The module runs in-process
(tests/module_harness.py); requests go through the front door's TLS port with a client key, as a client's do."""
from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

import requires
from fake_haproxy import short_socket_dir
from inventories import ROOT
from module_harness import run
from self_signed import self_signed

from ansible_collections.pdctl.vllm_pd.plugins.module_utils.rolling import (
    RollingError, haproxy_ask, haproxy_get_var, parse_stat, server_row)
from ansible_collections.pdctl.vllm_pd.plugins.modules import frontdoor_admission

ROLE = ROOT / "roles/frontdoor"
KEY = "admission-test-key-0123456789"
# The configuration's full limits: pdctl_frontdoor_max_inflight 64, the default queue of twice that; the
# degraded mode's at the role's default factor of 1/2.
FULL, DEGRADED = (64, 128), (32, 64)
DEGRADED_ARGS = {"backend": "be_admission_degraded", "queue_var": "proc.pdctl_admission_degraded_queue"}
# Generous bounds: CI runs the unit tests at the lowest priority beside the lab.
WAIT_S = 60


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Upstream(ThreadingHTTPServer):
    """Router, decode and aggregated router in one: /readiness and /health answer at once (/health 503 while
    `decode_lost`), every other request waits until `release` is set."""
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.release = threading.Event()
        self.decode_lost = False

    def handle_error(self, request, client_address):
        pass  # HAProxy's health checks hang up once they have the status line


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health" and self.server.decode_lost:
            self._answer(503, {"status": "decode lost"})
        elif self.path in ("/readiness", "/health"):
            self._answer(200, {"status": "ok"})
        else:
            self.server.release.wait(WAIT_S)
            self._answer(200, {"object": "list", "data": []})

    def _answer(self, status, doc):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _render(directory, upstream_port):
    """haproxy.cfg from the role's template (defaults and vars as the role has them), for one front door and
    one router host, `localhost`, whose every URL is the upstream server."""
    url = "http://127.0.0.1:%d" % upstream_port
    instances = [{"name": "decode-0", "host": "localhost", "pool": "decode", "gpus": list(range(8)), "url": url}]
    instances += [{"name": "prefill-%d" % i, "host": "localhost", "pool": "prefill", "gpus": [0, 1, 2, 3],
                   "url": "http://127.0.0.1:%d" % (9100 + i)} for i in range(4)]
    port, metrics_port = _free_port(), _free_port()
    extra = {
        "preflight_plan": {"frontdoor": {"hosts": ["localhost"], "vip": None, "port": port, "metrics_port": metrics_port},
                           "routers": [{"host": "localhost", "url": url, "standby_url": "http://127.0.0.1:%d" % _free_port(),
                                        "aggregated_url": url, "decode_urls": [url]}],
                           "instances": instances, "quarantined": []},
        "pdctl_frontdoor_max_inflight": FULL[0], "frontdoor_hard_stop_after_s": 5, "frontdoor_send_upstream_key": False,
        "frontdoor_config_dir": str(directory), "frontdoor_runtime_socket": str(directory / "admin.sock"),
        "frontdoor_user": "haproxy", "ansible_python_interpreter": sys.executable}
    (directory / "extra.yml").write_text(yaml.safe_dump(extra))
    playbook = directory / "render.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "vars_files": [str(ROLE / "defaults/main.yml"), str(ROLE / "vars/main.yml")],
        "tasks": [{"ansible.builtin.template": {"src": str(ROLE / "templates/haproxy.cfg.j2"),
                                                "dest": str(directory / "haproxy.cfg"), "mode": "0600"}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    res = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                          "-c", "local", str(playbook), "-e", "@%s" % (directory / "extra.yml")],
                         capture_output=True, text=True, env=env, cwd=directory)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # Its own name for the internal hop to the routers: an abstract socket is one per network namespace, and
    # another test worker may run the same front door at once.
    cfg = directory / "haproxy.cfg"
    cfg.write_text(cfg.read_text().replace("abns@pdctl-routers", "abns@pdctl-routers-%s" % directory.name))
    return port, extra


class FrontDoor:
    def __init__(self, directory, port, upstream, variables):
        self.directory, self.port, self.upstream = directory, port, upstream
        self.socket = str(directory / "admin.sock")
        self.variables = variables   # the plan and limits it was rendered from

    def stat(self, backend, server="admission"):
        return server_row(parse_stat(haproxy_ask(self.socket, "show stat")), backend, server)

    def limits(self, backend="be_admission", queue_var="proc.pdctl_admission_queue"):
        return int(self.stat(backend)["slim"]), int(haproxy_get_var(self.socket, queue_var))

    def wait_for(self, what, condition):
        deadline = time.monotonic() + WAIT_S
        while not condition():
            assert time.monotonic() < deadline, "the front door never reached: %s" % what
            time.sleep(0.05)

    def request(self):
        """(status, body, seconds) of one GET /v1/models through the front door."""
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=context, timeout=WAIT_S)
        t0 = time.monotonic()
        try:
            conn.request("GET", "/v1/models", headers={"Authorization": "Bearer " + KEY})
            res = conn.getresponse()
            return res.status, res.read().decode(), time.monotonic() - t0
        finally:
            conn.close()

    def hold(self):
        """Start a request in the background; returns the thread, its result in thread.result."""
        def go():
            thread.result = self.request()
        thread = threading.Thread(target=go, daemon=True)
        thread.start()
        return thread


def _up(door, proc):
    assert proc.poll() is None, "HAProxy exited: %s" % (door.directory / "haproxy.log").read_text()[-2000:]
    try:
        return door.stat("be_routers", "localhost")["status"].startswith("UP")
    except RollingError:  # not listening yet
        return False


@pytest.fixture(scope="module")
def front_door():
    haproxy = requires.binary("haproxy", "the admission module is tested against a real HAProxy")
    directory = Path(short_socket_dir())
    upstream = Upstream()
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    proc = None
    try:
        port, variables = _render(directory, upstream.server_address[1])
        (directory / "pdctl").mkdir(exist_ok=True)
        self_signed(directory / "pdctl/frontdoor.pem")
        (directory / "pdctl/clients.map").write_text("%s tester\n" % hashlib.sha256(KEY.encode()).hexdigest())
        check = subprocess.run([haproxy, "-c", "-f", str(directory / "haproxy.cfg")], capture_output=True, text=True)
        assert check.returncode == 0 and "[WARNING]" not in check.stderr, check.stdout + check.stderr
        with open(directory / "haproxy.log", "w") as log:
            proc = subprocess.Popen([haproxy, "-db", "-f", str(directory / "haproxy.cfg")], stdout=log, stderr=log)
        door = FrontDoor(directory, port, upstream, variables)
        door.wait_for("its P/D router up", lambda: _up(door, proc))
        yield door
    finally:
        upstream.release.set()
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        upstream.shutdown()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def door(front_door):
    """The front door at its configured limits, every held request let go, the decode answering."""
    yield front_door
    front_door.upstream.release.set()
    front_door.upstream.decode_lost = False
    for args, (inflight, queue) in (({"backend": "be_admission", "queue_var": "proc.pdctl_admission_queue"}, FULL),
                                    (DEGRADED_ARGS, DEGRADED)):
        frontdoor_admission.run(dict(args, inflight=inflight, queue=queue, lower_only=False, server="admission",
                                     socket=front_door.socket), False)
    front_door.wait_for("no request in flight", lambda: int(front_door.stat("be_admission")["scur"]) == 0
                        and int(front_door.stat("be_admission_degraded")["scur"]) == 0)
    front_door.wait_for("the P/D router up", lambda: front_door.stat("be_routers", "localhost")["status"].startswith("UP"))
    front_door.upstream.release.clear()


def _admit(door, capsys, inflight, queue, check_mode=False, **args):
    return run("frontdoor_admission", dict(args, inflight=inflight, queue=queue, socket=door.socket), capsys,
               check_mode=check_mode)


def test_the_configuration_holds_the_full_limits(door):
    assert door.limits() == FULL
    assert door.limits("be_admission_degraded", "proc.pdctl_admission_degraded_queue") == DEGRADED


def test_shrinks_and_grows_back_idempotent(door, capsys):
    failed, res, dummy = _admit(door, capsys, *FULL)
    assert not failed and not res["changed"] and (res["inflight"], res["queue"]) == FULL
    failed, res, dummy = _admit(door, capsys, 16, 32)
    assert not failed and res["changed"]
    assert (res["inflight_previous"], res["queue_previous"], res["inflight"], res["queue"]) == (64, 128, 16, 32)
    assert res["diff"] == {"before": "be_admission/admission: 64 in flight, queue 128\n",
                           "after": "be_admission/admission: 16 in flight, queue 32\n"}
    assert door.limits() == (16, 32)
    failed, res, dummy = _admit(door, capsys, 16, 32)
    assert not failed and not res["changed"]
    failed, res, dummy = _admit(door, capsys, *FULL)
    assert not failed and res["changed"] and door.limits() == FULL
    # The degraded mode's backend is untouched by the P/D one's limits.
    assert door.limits("be_admission_degraded", "proc.pdctl_admission_degraded_queue") == DEGRADED


def test_check_mode_reports_and_changes_nothing(door, capsys):
    failed, res, dummy = _admit(door, capsys, 16, 32, check_mode=True)
    assert not failed and res["changed"] and (res["inflight"], res["queue"]) == (16, 32)
    assert door.limits() == FULL
    failed, res, dummy = _admit(door, capsys, *FULL, check_mode=True)
    assert not failed and not res["changed"]


def test_lower_only_never_raises(door, capsys):
    failed, res, dummy = _admit(door, capsys, 48, 256, lower_only=True)
    assert not failed and res["changed"] and door.limits() == (48, 128)
    failed, res, dummy = _admit(door, capsys, 64, 96, lower_only=True)
    assert not failed and res["changed"] and door.limits() == (48, 96)
    failed, res, dummy = _admit(door, capsys, 64, 128, lower_only=True)
    assert not failed and not res["changed"] and door.limits() == (48, 96)


def test_a_request_beyond_the_limit_queues_and_one_beyond_the_queue_gets_503_at_once(door, capsys):
    assert not _admit(door, capsys, 1, 1)[0]
    first = door.hold()
    door.wait_for("one request in flight", lambda: int(door.stat("be_admission")["scur"]) == 1)
    second = door.hold()
    # It waits in the backend's queue (one server, no persistence).
    door.wait_for("one request queued", lambda: int(door.stat("be_admission", "BACKEND")["qcur"]) == 1)
    failed, res, dummy = _admit(door, capsys, 1, 1)
    assert not failed and not res["changed"] and (res["sessions"], res["queued"]) == (1, 1)
    status, body, seconds = door.request()
    assert status == 503 and "at capacity" in body and seconds < 10
    assert int(door.stat("be_admission")["scur"]) == 1   # the limit held
    door.upstream.release.set()
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert first.result[0] == 200 and second.result[0] == 200


def test_a_queue_of_0_refuses_at_once_only_when_no_slot_is_free(door, capsys):
    assert not _admit(door, capsys, 1, 0)[0]
    first = door.hold()
    door.wait_for("one request in flight", lambda: int(door.stat("be_admission")["scur"]) == 1)
    status, body, seconds = door.request()
    assert status == 503 and seconds < 10
    assert int(door.stat("be_admission", "BACKEND")["qcur"]) == 0
    door.upstream.release.set()
    first.join(WAIT_S)
    assert first.result[0] == 200
    # A free slot: served, the queue bound does not matter.
    assert door.request()[0] == 200


def test_without_a_p_d_router_requests_go_through_the_degraded_admission(door, capsys):
    door.upstream.decode_lost = True
    door.wait_for("the P/D router down", lambda: door.stat("be_routers", "localhost")["status"].startswith("DOWN"))
    assert not _admit(door, capsys, 1, 0, **DEGRADED_ARGS)[0]
    before = int(door.stat("be_admission_degraded")["stot"])
    first = door.hold()
    door.wait_for("one degraded request in flight", lambda: int(door.stat("be_admission_degraded")["scur"]) == 1)
    assert int(door.stat("be_admission_degraded")["stot"]) == before + 1
    status, body, seconds = door.request()
    assert status == 503 and seconds < 10
    door.upstream.release.set()
    first.join(WAIT_S)
    assert first.result[0] == 200   # served by the aggregated router


@pytest.mark.parametrize("args, message", [
    ({"inflight": 0, "queue": 8}, "inflight must be at least 1, got 0"),
    ({"inflight": 8, "queue": -1}, "queue must be 0 or more, got -1"),
    ({"inflight": 8, "queue": 8, "queue_var": "txn.x"}, "queue_var must be a process-wide variable"),
    ({"inflight": 8, "queue": 8, "server": "nope"}, "HAProxy has no server be_admission/nope"),
    ({"inflight": 8, "queue": 8, "queue_var": "proc.pdctl_nothing"},
     "the running HAProxy has no variable proc.pdctl_nothing (its configuration predates admission"),
])
def test_refusals_name_the_problem_and_change_nothing(door, capsys, args, message):
    failed, res, dummy = run("frontdoor_admission", dict(args, socket=door.socket), capsys)
    assert failed and message in res["msg"] and door.socket in res["msg"]
    assert door.limits() == FULL


def test_socket_missing_fails_clearly(capsys):
    directory = short_socket_dir()
    path = os.path.join(directory, "admin.sock")
    try:
        failed, res, dummy = run("frontdoor_admission", {"inflight": 8, "queue": 8, "socket": path}, capsys)
    finally:
        os.rmdir(directory)
    assert failed and res["msg"].startswith("cannot reach HAProxy's runtime socket %s: " % path)


# ---------------------------------------------------------------- the task files that call it


def _play(door, tasks, *args):
    """Run tasks on localhost (the front-door host of the rendered plan) with ansible-playbook; its stdout."""
    directory = door.directory
    (directory / "play.yml").write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    (directory / "play-vars.yml").write_text(yaml.safe_dump(dict(door.variables, ansible_python_interpreter=sys.executable)))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STRATEGY="linear")
    res = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                          "-c", "local", str(directory / "play.yml"), "-e", "@%s" % (directory / "play-vars.yml")]
                         + list(args), capture_output=True, text=True, env=env, cwd=directory)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    return res.stdout


def test_the_roles_admission_step_restores_what_the_plan_serves_less_a_quarantined_host(door, capsys):
    """roles/frontdoor's admission.yml with the role's defaults, as 0050-admission.yml runs it at every converge:
    a run that stopped half-way left the limits low; the plan less the quarantined host's two prefill
    instances serves half."""
    assert not _admit(door, capsys, 16, 32)[0]
    quarantined = dict(door.variables["preflight_plan"], quarantined=[{"host": "p1", "instances": ["prefill-2", "prefill-3"]}])
    role = {"name": "Admission", "ansible.builtin.include_role": {"name": "pdctl.vllm_pd.frontdoor", "tasks_from": "admission.yml"}}
    out = _play(door, [role], "-e", json.dumps({"preflight_plan": quarantined}))
    assert "changed=1" in out
    assert door.limits() == (32, 64)
    assert door.limits("be_admission_degraded", "proc.pdctl_admission_degraded_queue") == (16, 32)
    out = _play(door, [role])
    assert "changed=1" in out and door.limits() == FULL
    assert "changed=0" in _play(door, [role])


def test_a_traffic_move_sets_every_front_door_to_what_its_target_serves(door):
    """pdctl.vllm_pd.traffic's admission entry point, as its frontdoor_away/home call it: the release switch's
    pair phase (1 of 4 prefill, the temporary decode on 4 of 8 GPUs) lowers the P/D and degraded admission."""
    pair = {"prefill_in_service": 1, "prefill_total": 4, "decode_gpus_in_service": 4, "decode_gpus_total": 8}
    include = {"name": "Admission", "ansible.builtin.include_role": {"name": "pdctl.vllm_pd.traffic", "tasks_from": "admission"},
               "vars": {"traffic_admission_capacity": pair}}
    out = _play(door, [include], "--check", "--diff")
    assert "64 in flight, queue 128" in out and "16 in flight, queue 32" in out and "changed=1" in out
    assert door.limits() == FULL   # check mode: nothing set
    out = _play(door, [include])
    assert "changed=1" in out
    assert door.limits() == (16, 32)
    assert door.limits("be_admission_degraded", "proc.pdctl_admission_degraded_queue") == (8, 16)
    # Lowering only, to more than it admits now: nothing changes.
    out = _play(door, [dict(include, vars={"traffic_admission_capacity": dict(pair, prefill_in_service=3, decode_gpus_in_service=8),
                                          "traffic_admission_lower_only": True})])
    assert "changed=0" in out and door.limits() == (16, 32)
