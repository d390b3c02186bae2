# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""frontdoor_server against a fake HAProxy runtime API on a real UNIX socket (tests/fake_haproxy.py,
built from real 2.6 captures), instance_drain against a real HTTP server serving vLLM /metrics pages
that change as they are read. Both modules run in-process (tests/module_harness.py)."""
from __future__ import annotations

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fake_haproxy import CMAINT, FDRAIN, FMAINT, front_door, short_socket_dir
from module_harness import run

# The deadline of a wait that should succeed: the fakes answer at once, so a passing test returns long
# before it, but CI runs the unit tests at the lowest priority beside the lab, where a 0.5 s wait once took 14 s.
RETURNS_WITHIN_S = 60

# ---------------------------------------------------------------- frontdoor_server


@pytest.fixture
def haproxy():
    fake, cleanup = front_door()
    yield fake
    cleanup()


def frontdoor(fake, capsys, check_mode=False, **args):
    return run("frontdoor_server", dict(args, socket=fake.path), capsys, check_mode=check_mode)


def test_drain_changes_the_state_and_reports_the_previous_one(haproxy, capsys):
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-0", state="drain")
    assert not failed and res["changed"]
    assert res["previous_state"] == "ready" and res["status"] == "DRAIN" and res["sessions"] == 0
    assert haproxy.sets == ["set server be_routers/lab-decode-0 state drain"]
    assert haproxy.servers["lab-decode-0"].admin == FDRAIN
    assert haproxy.servers["lab-decode-1"].admin == 0   # the other router untouched


def test_maint_then_ready_round_trip(haproxy, capsys):
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-1", state="maint")
    assert not failed and res["changed"] and res["previous_state"] == "ready" and res["status"] == "MAINT"
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-1", state="ready")
    assert not failed and res["changed"] and res["previous_state"] == "maint"
    assert res["status"] == "DOWN" and res["waited_s"] == 0.0   # wait=none: its checks have not run yet
    assert haproxy.sets == ["set server be_routers/lab-decode-1 state maint",
                            "set server be_routers/lab-decode-1 state ready"]


@pytest.mark.parametrize("server, state", [("lab-decode-0-standby", "maint"), ("lab-decode-0", "ready")])
def test_same_state_is_not_changed_and_sends_no_set(haproxy, capsys, server, state):
    failed, res, dummy = frontdoor(haproxy, capsys, server=server, state=state)
    assert not failed and not res["changed"] and res["previous_state"] == state
    assert haproxy.sets == []


def test_drained_router_whose_checks_fail_is_still_drained(haproxy, capsys):
    """A drained router that was stopped reads DOWN in `show stat`, as a ready one does: the admin state
    must come from srv_admin_state, or `state=ready` would be a no-op and leave it drained for good."""
    router = haproxy.servers["lab-decode-1"]
    router.admin, router.health = FDRAIN, ["DOWN"]
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-1", state="drain")
    assert not failed and not res["changed"] and res["previous_state"] == "drain" and res["status"] == "DOWN"
    assert haproxy.sets == []
    router.health = ["DOWN", "UP"]   # restarted: its next check passes
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-1", state="ready", wait="up", timeout=RETURNS_WITHIN_S)
    assert not failed and res["changed"] and res["previous_state"] == "drain"
    assert haproxy.sets == ["set server be_routers/lab-decode-1 state ready"]
    assert res["status"] == "UP" and router.admin == 0   # UP, not DRAIN: it takes traffic again


def test_check_decode_points_the_routers_check_at_another_decode_and_back(haproxy, capsys):
    """A release switch pairs the router with the temporary decode: its check must ask that one (the plan's
    decode is switching), and the plan's again afterwards; a second call changes nothing."""
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-0", check_decode="http://10.89.64.11:8101")
    assert not failed and res["changed"] and res["check_decode_previous"] == "http://10.89.64.13:8100"
    assert haproxy.sets == ["set server be_check_lab-decode-0/router check-addr 10.89.64.11 port 8101"]
    assert haproxy.checks["lab-decode-0"] == ["10.89.64.11", 8101]
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-0", check_decode="http://10.89.64.11:8101")
    assert not failed and not res["changed"] and len(haproxy.sets) == 1
    failed, res, dummy = frontdoor(haproxy, capsys, check_mode=True, server="lab-decode-0",
                                   check_decode="http://10.89.64.13:8100")
    assert not failed and res["changed"] and len(haproxy.sets) == 1   # check mode: reported, not set
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-0", check_decode="http://10.89.64.13:8100")
    assert not failed and res["changed"] and haproxy.checks["lab-decode-0"] == ["10.89.64.13", 8100]


@pytest.mark.parametrize("server, url, message", [
    ("lab-decode-0-standby", "http://10.89.64.11:8101", "no check backend be_check_lab-decode-0-standby"),
    ("lab-decode-0", "10.89.64.11:8101", "check_decode must be http://HOST:PORT"),
])
def test_check_decode_refuses_a_server_without_a_check_and_a_bad_url(haproxy, capsys, server, url, message):
    failed, res, dummy = frontdoor(haproxy, capsys, server=server, check_decode=url)
    assert failed and message in res["msg"], res
    assert haproxy.sets == []


def test_check_mode_changes_nothing_and_does_not_wait(haproxy, capsys):
    failed, res, dummy = frontdoor(haproxy, capsys, check_mode=True, server="lab-decode-0-standby", state="ready",
                                   wait="up", timeout=30)
    assert not failed and res["changed"] and res["previous_state"] == "maint"
    assert res["status"] == "MAINT" and res["waited_s"] == 0.0
    assert haproxy.sets == [] and haproxy.stat_reads == 1   # one read: no wait
    assert haproxy.servers["lab-decode-0-standby"].admin == FMAINT | CMAINT


def test_check_mode_same_state_is_not_changed(haproxy, capsys):
    failed, res, dummy = frontdoor(haproxy, capsys, check_mode=True, server="lab-decode-0", state="ready")
    assert not failed and not res["changed"] and haproxy.sets == []


@pytest.mark.parametrize("rejoin", [
    ["DOWN", "DOWN", "UP"],
    ["UP 1/2", "UP 1/2", "UP"],   # what HAProxy 2.6 shows until the first check after maintenance
])
def test_ready_waits_until_the_checks_pass(haproxy, capsys, rejoin):
    haproxy.rejoin = rejoin
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-0-standby", state="ready", wait="up", timeout=RETURNS_WITHIN_S)
    assert not failed, res
    assert res["changed"] and res["previous_state"] == "maint" and res["status"] == "UP"
    # one read before the set, then one per status: two half-second sleeps before UP
    assert haproxy.stat_reads == 4
    assert 0.9 <= res["waited_s"] < RETURNS_WITHIN_S  # upper bound: it returned
    # CMAINT (`disabled` in the config) stays, as in HAProxy: it does not make the server maint
    assert haproxy.servers["lab-decode-0-standby"].admin == CMAINT


def test_wait_up_times_out_naming_the_server_and_status(haproxy, capsys):
    haproxy.rejoin = ["DOWN"]
    t0 = time.monotonic()
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-0-standby", state="ready", wait="up", timeout=1)
    assert failed
    assert res["msg"] == ("be_routers/lab-decode-0-standby did not become up within 1 s (status DOWN, 0 request(s) "
                          "in flight)")
    assert 1.0 <= time.monotonic() - t0 < RETURNS_WITHIN_S  # upper bound: it returned
    assert haproxy.sets == ["set server be_routers/lab-decode-0-standby state ready"]


def test_drain_waits_until_idle(haproxy, capsys):
    haproxy.servers["lab-decode-0"].scur = [4, 4, 2, 0]
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-0", state="drain", wait="idle", timeout=RETURNS_WITHIN_S)
    assert not failed, res
    assert res["changed"] and res["status"] == "DRAIN" and res["sessions"] == 0
    assert haproxy.stat_reads == 4 and 0.9 <= res["waited_s"] < RETURNS_WITHIN_S  # upper bound: it returned


def test_maint_with_drain_first_lets_the_streams_finish_then_takes_it_out(haproxy, capsys):
    haproxy.servers["lab-decode-0"].scur = [3, 3, 1, 0]
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-0", state="maint", drain_first=True, timeout=RETURNS_WITHIN_S)
    assert not failed, res
    assert res["changed"] and res["previous_state"] == "ready" and res["status"] == "MAINT"
    assert haproxy.sets == ["set server be_routers/lab-decode-0 state drain",
                            "set server be_routers/lab-decode-0 state maint"]
    assert haproxy.stat_reads >= 4


def test_maint_with_drain_first_leaves_a_server_in_maintenance_alone(haproxy, capsys):
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-0-standby", state="maint", drain_first=True)
    assert not failed and not res["changed"] and haproxy.sets == []


def test_maint_with_drain_first_waits_for_a_server_left_draining(haproxy, capsys):
    frontdoor(haproxy, capsys, server="lab-decode-0", state="drain")
    haproxy.servers["lab-decode-0"].scur = [2, 1, 0]
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-0", state="maint", drain_first=True, timeout=RETURNS_WITHIN_S)
    assert not failed and res["previous_state"] == "drain" and res["status"] == "MAINT"
    assert haproxy.sets[-1] == "set server be_routers/lab-decode-0 state maint"
    assert haproxy.stat_reads >= 3  # it waited for the two streams before taking it out


def test_wait_idle_times_out_naming_the_server_and_its_sessions(haproxy, capsys):
    haproxy.servers["lab-decode-0"].scur = [7]
    t0 = time.monotonic()
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-0", state="drain", wait="idle", timeout=1)
    assert failed
    assert res["msg"] == ("be_routers/lab-decode-0 did not become idle within 1 s (status DRAIN, 7 request(s) in "
                          "flight)")
    assert 1.0 <= time.monotonic() - t0 < RETURNS_WITHIN_S  # upper bound: it returned
    # the drain itself was done: a retry of the task finds it drained
    assert haproxy.servers["lab-decode-0"].admin == FDRAIN


def test_wait_without_state_only_waits(haproxy, capsys):
    haproxy.servers["lab-decode-1"].scur = [1, 1, 0]
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-1", wait="idle", timeout=RETURNS_WITHIN_S)
    assert not failed and not res["changed"] and res["sessions"] == 0 and res["previous_state"] == "ready"
    assert haproxy.sets == [] and haproxy.stat_reads == 3


def test_unknown_server_fails_naming_the_known_ones(haproxy, capsys):
    failed, res, dummy = frontdoor(haproxy, capsys, server="lab-decode-7", state="drain")
    assert failed
    assert res["msg"] == ("HAProxy has no server be_routers/lab-decode-7 (servers: be_routers/lab-decode-0, "
                          "be_routers/lab-decode-0-standby, be_routers/lab-decode-1)")
    assert haproxy.sets == []


def test_unknown_backend_fails_naming_the_known_servers(haproxy, capsys):
    failed, res, dummy = frontdoor(haproxy, capsys, backend="be_other", server="lab-decode-0", state="drain")
    assert failed and "HAProxy has no server be_other/lab-decode-0 (servers: be_routers/lab-decode-0," in res["msg"]
    assert haproxy.sets == []


def test_a_refused_set_fails_with_haproxys_words(capsys):
    fake, cleanup = front_door(level="operator")
    try:
        failed, res, dummy = frontdoor(fake, capsys, server="lab-decode-0", state="drain")
    finally:
        cleanup()
    assert failed
    assert res["msg"] == "HAProxy refused `set server be_routers/lab-decode-0 state drain`: Permission denied"


def test_socket_missing_fails_clearly(capsys):
    directory = short_socket_dir()
    path = os.path.join(directory, "admin.sock")
    try:
        failed, res, dummy = run("frontdoor_server", {"server": "lab-decode-0", "state": "drain", "socket": path}, capsys)
    finally:
        os.rmdir(directory)
    assert failed
    assert res["msg"].startswith("cannot reach HAProxy's runtime socket %s: " % path)
    assert "No such file or directory" in res["msg"] and "is the front door running on this host?" in res["msg"]


# ---------------------------------------------------------------- instance_drain

def vllm_page(running, waiting):
    """A vLLM /metrics page: running[i] and waiting[i] for engine i."""
    out = ["# HELP vllm:num_requests_running Number of requests in model execution batches.",
           "# TYPE vllm:num_requests_running gauge"]
    out += ['vllm:num_requests_running{engine="%d",model_name="m"} %.1f' % (i, n) for i, n in enumerate(running)]
    out += ["# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge"]
    out += ['vllm:num_requests_waiting{engine="%d",model_name="m"} %.1f' % (i, n) for i, n in enumerate(waiting)]
    out += ["# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5']
    return "\n".join(out) + "\n"


BUSY = vllm_page(running=(2, 1, 0), waiting=(0, 0, 3))
IDLE = vllm_page(running=(0, 0, 0), waiting=(0, 0, 0))


class Metrics:
    """An HTTP server whose /metrics serves the next scripted page on each read (the last one stays)."""

    def __init__(self):
        self.pages = [IDLE]
        self.reads = []   # (monotonic time, page served)
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                page = metrics.pages.pop(0) if len(metrics.pages) > 1 else metrics.pages[0]
                metrics.reads.append((time.monotonic(), page))
                body = page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/metrics" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def metrics():
    server = Metrics()
    yield server
    server.close()


def drain(metrics, capsys, check_mode=False, **args):
    return run("instance_drain", dict({"url": metrics.url, "poll_s": 0.1}, **args), capsys, check_mode=check_mode)


def test_waits_for_the_engines_to_empty_then_for_settle_s(metrics, capsys):
    metrics.pages = [BUSY, BUSY, vllm_page((0, 0, 0), (0, 1, 0)), IDLE]
    failed, res, dummy = drain(metrics, capsys, settle_s=0.5, timeout=RETURNS_WITHIN_S)
    assert not failed, res
    assert res == dict(res, changed=False, running=0, waiting=0)
    first_idle = next(i for i, (dummy, page) in enumerate(metrics.reads) if page is IDLE)
    assert first_idle == 3   # one engine still waiting kept it busy
    quiet = metrics.reads[-1][0] - metrics.reads[first_idle][0]
    assert 0.5 <= quiet < RETURNS_WITHIN_S   # it settled for settle_s; upper bound: it returned
    assert all(page is IDLE for dummy, page in metrics.reads[first_idle:])
    assert res["waited_s"] >= 0.3 + 0.4


def test_idle_from_the_start_still_settles(metrics, capsys):
    failed, res, dummy = drain(metrics, capsys, settle_s=0.5, timeout=RETURNS_WITHIN_S)
    assert not failed and res["running"] == 0 and res["waiting"] == 0
    # upper bound: it returned (the unit tests run at the lowest priority beside the lab tests)
    assert 0.5 <= res["waited_s"] < RETURNS_WITHIN_S and len(metrics.reads) >= 2


def drain_on_clock(read, now):
    """instance_drain on a scripted clock: now[0] is the time; sleeping and read() move it on."""
    from ansible_collections.pdctl.vllm_pd.plugins.modules import instance_drain

    def sleep(seconds):
        now[0] += seconds

    return instance_drain.run({"url": "http://x/metrics", "settle_s": 0.5, "timeout": 10, "poll_s": 0.125}, False,
                              read=read, clock=lambda: now[0], sleep=sleep)


def test_a_read_slower_than_the_quiet_window_is_confirmed_by_another():
    """A busy machine: the first read alone takes longer than settle_s. One quiet read is no quiet
    window: a read sent settle_s or more after it came back has to find the instance quiet too (in CI
    beside the lab, the module returned after one read). The second read, sent 0.125 s after the first
    came back, confirms nothing yet."""
    now, reads = [0.0], []

    def read(url):
        now[0] += 1.2  # slower than settle_s
        reads.append(now[0])
        return (0, 0)

    res = drain_on_clock(read, now)
    assert len(reads) == 3 and res["running"] == 0 and res["waiting"] == 0, (reads, res)


def test_a_quiet_read_that_comes_back_late_starts_the_quiet_when_it_came_back():
    """A read sees the instance at some moment between its send and its reply. The quiet is known to
    have begun only by the reply: counted from the send, a slow reply shortened the observed quiet to
    0.24 s of a 0.5 s settle_s in CI. Scripted: the first quiet read is served 0.25 s after its send."""
    pages, served, now = [(1, 0), (0, 0)], [], [0.0]

    def read(url):
        page = pages.pop(0) if len(pages) > 1 else pages[0]
        if page == (0, 0) and not any(p == (0, 0) for t, p in served):
            now[0] += 0.25   # the server answers late; the page is what it was when served
        served.append((now[0], page))
        return page

    res = drain_on_clock(read, now)
    quiet = [t for t, page in served if page == (0, 0)]
    assert res == dict(res, running=0, waiting=0)
    assert quiet[0] == 0.375 and quiet[-1] - quiet[0] >= 0.5, served   # binary-exact steps of 0.125


def test_a_request_during_the_quiet_starts_it_over():
    """On the module's own clock, scripted here: over HTTP, a machine too busy to poll on time could let
    the quiet end before the busy read came (it did, in CI beside the lab)."""
    pages, reads, now = [(0, 0), (0, 0), (1, 0), (0, 0)], [], [0.0]

    def read(url):
        page = pages.pop(0) if len(pages) > 1 else pages[0]
        reads.append((now[0], page))
        return page

    # Binary-exact steps: reads at 0, 0.125 (quiet), 0.25 (busy), then quiet again from 0.375.
    res = drain_on_clock(read, now)
    assert [t for t, page in reads if page != (0, 0)] == [0.25]
    assert res == dict(res, running=0, waiting=0, waited_s=0.88)  # 0.375 + 0.5 (round(0.875, 2))
    assert reads[-1][0] == 0.875 and all(page == (0, 0) for t, page in reads if t > 0.25)


def test_times_out_naming_running_and_waiting(metrics, capsys):
    metrics.pages = [BUSY]
    t0 = time.monotonic()
    failed, res, dummy = drain(metrics, capsys, settle_s=0.2, timeout=1, poll_s=0.2)
    assert failed
    assert res["msg"] == ("%s still has 3 request(s) running and 3 waiting after 1 s: has every router stopped "
                          "sending to it?" % metrics.url)
    assert 1.0 <= time.monotonic() - t0 < RETURNS_WITHIN_S  # upper bound: it returned


def test_check_mode_reads_once_and_does_not_wait(metrics, capsys):
    metrics.pages = [BUSY, IDLE]
    failed, res, dummy = drain(metrics, capsys, check_mode=True, settle_s=5, timeout=30)
    assert not failed
    assert res == dict(res, changed=False, running=3, waiting=3, waited_s=0.0)
    assert len(metrics.reads) == 1


def test_a_page_without_the_metrics_fails_clearly(metrics, capsys):
    metrics.pages = ["# HELP node_load1 1m load average.\n# TYPE node_load1 gauge\nnode_load1 0.42\n"]
    failed, res, dummy = drain(metrics, capsys, timeout=5)
    assert failed
    assert res["msg"] == ("%s: no vllm:num_requests_running or vllm:num_requests_waiting on the page: not a vLLM "
                          "instance's /metrics" % metrics.url)
    assert len(metrics.reads) == 1   # no point in polling it


def test_a_wrong_path_fails_naming_the_url_and_the_http_error(metrics, capsys):
    url = metrics.url.replace("/metrics", "/health")
    failed, res, dummy = run("instance_drain", {"url": url, "timeout": 5}, capsys)
    assert failed and res["msg"].startswith("cannot read %s: " % url) and "404" in res["msg"]


def test_nothing_listening_fails_naming_the_url(capsys):
    server = Metrics()
    url = server.url
    server.close()   # the port is free again: connection refused
    failed, res, dummy = run("instance_drain", {"url": url, "timeout": 5}, capsys)
    assert failed and res["msg"].startswith("cannot read %s: " % url)


def test_a_stopped_instance_is_drained_with_stopped_ok(capsys):
    server = Metrics()
    url = server.url
    server.close()
    failed, res, dummy = run("instance_drain", {"url": url, "timeout": 5, "stopped_ok": True}, capsys)
    assert not failed and res["stopped"] is True and res["running"] == 0 and res["waited_s"] == 0.0


def test_stopped_ok_still_fails_on_a_page_that_is_not_metrics(metrics, capsys):
    url = metrics.url.replace("/metrics", "/health")
    failed, res, dummy = run("instance_drain", {"url": url, "timeout": 5, "stopped_ok": True}, capsys)
    assert failed and "404" in res["msg"]


def test_a_running_instance_reports_not_stopped(metrics, capsys):
    failed, res, dummy = run("instance_drain", {"url": metrics.url, "settle_s": 0.1, "stopped_ok": True}, capsys)
    assert not failed and res["stopped"] is False
