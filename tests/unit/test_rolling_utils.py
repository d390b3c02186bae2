# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""module_utils/rolling.py: HAProxy's runtime-API answers (real 2.6 captures) and a vLLM instance's
in-flight count."""
from __future__ import annotations

import os
import shutil
import socket
import threading

import pytest
from fake_haproxy import SHOW_SERVERS_STATE, SHOW_STAT, short_socket_dir

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import rolling
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.rolling import RollingError

# ---------------------------------------------------------------- HAProxy


def test_parse_stat_reads_the_real_2_6_answer_by_column_name():
    rows = rolling.parse_stat(SHOW_STAT)
    assert [(r["pxname"], r["svname"]) for r in rows] == [
        ("fe_api", "FRONTEND"), ("be_routers", "lab-decode-0"), ("be_routers", "lab-decode-0-standby"),
        ("be_routers", "lab-decode-1"), ("be_routers", "BACKEND")]
    by_name = {r["svname"]: r for r in rows}
    assert {n: by_name[n]["status"] for n in by_name} == {
        "FRONTEND": "OPEN", "lab-decode-0": "UP", "lab-decode-0-standby": "MAINT", "lab-decode-1": "DOWN",
        "BACKEND": "UP"}
    assert by_name["lab-decode-0"]["scur"] == "0" and by_name["lab-decode-0"]["check_status"] == "L7OK"
    assert by_name["lab-decode-1"]["check_desc"] == "Layer4 connection problem"
    assert by_name["lab-decode-0"]["addr"] == "127.0.0.1:18091"


def test_parse_stat_wants_the_header():
    with pytest.raises(RollingError, match="without its header.*Permission denied"):
        rolling.parse_stat("Permission denied\n\n")
    with pytest.raises(RollingError, match="without its header"):
        rolling.parse_stat("")


def test_server_row_finds_the_server_or_names_the_known_ones():
    rows = rolling.parse_stat(SHOW_STAT)
    assert rolling.server_row(rows, "be_routers", "lab-decode-1")["status"] == "DOWN"
    with pytest.raises(RollingError) as exc:
        rolling.server_row(rows, "be_routers", "lab-decode-9")
    assert str(exc.value) == ("HAProxy has no server be_routers/lab-decode-9 (servers: be_routers/lab-decode-0, "
                              "be_routers/lab-decode-0-standby, be_routers/lab-decode-1)")
    with pytest.raises(RollingError, match=r"no server be_other/lab-decode-0 \(servers: be_routers/"):
        rolling.server_row(rows, "be_other", "lab-decode-0")
    with pytest.raises(RollingError, match=r"\(servers: none\)"):
        rolling.server_row([r for r in rows if r["svname"] in ("FRONTEND", "BACKEND")], "be_routers", "x")


def test_parse_servers_state_reads_the_real_answer():
    rows = rolling.parse_servers_state(SHOW_SERVERS_STATE)
    assert [(r["srv_name"], r["srv_admin_state"], r["srv_op_state"]) for r in rows] == [
        ("lab-decode-0", "0", "2"), ("lab-decode-0-standby", "5", "0"), ("lab-decode-1", "8", "0")]
    with pytest.raises(RollingError, match="without its header.*Can't find backend"):
        rolling.parse_servers_state("Can't find backend.\n\n")


def test_the_admin_state_comes_from_the_admin_bits_not_the_status():
    # The capture's lab-decode-1 is drained and fails its checks: `show stat` says DOWN, as for a ready
    # server; only srv_admin_state tells.
    stat = {r["svname"]: r["status"] for r in rolling.parse_stat(SHOW_STAT)}
    state = {r["srv_name"]: rolling.admin_state(r["srv_admin_state"])
             for r in rolling.parse_servers_state(SHOW_SERVERS_STATE)}
    assert stat["lab-decode-1"] == "DOWN" and state["lab-decode-1"] == "drain"
    assert state == {"lab-decode-0": "ready", "lab-decode-0-standby": "maint", "lab-decode-1": "drain"}


@pytest.mark.parametrize("bits, state", [
    (0, "ready"), ("0", "ready"),
    (0x01, "maint"), (0x02, "maint"), (0x20, "maint"),   # forced, inherited, DNS resolution
    (0x04, "ready"),                                      # `disabled` in the config, since made ready
    (0x05, "maint"),                                      # `disabled`, never made ready
    (0x08, "drain"), (0x10, "drain"),                     # forced, inherited
    (0x09, "maint"),                                      # maintenance wins over drain
    (0x40, "ready"),                                      # FQDN set through the socket: no admin state
])
def test_admin_state_bits(bits, state):
    assert rolling.admin_state(bits) == state


@pytest.mark.parametrize("bad", [None, "", "-", "MAINT"])
def test_admin_state_unreadable(bad):
    with pytest.raises(RollingError, match="unreadable srv_admin_state"):
        rolling.admin_state(bad)


@pytest.mark.parametrize("status, up", [
    ("UP", True), ("DRAIN", True), ("no check", True), ("NO CHECK", True),
    ("UP 1/2", False),       # just out of maintenance, or failing: not yet trusted
    ("DOWN", False), ("DOWN 1/2", False), ("MAINT", False), ("MAINT (resolution)", False),
    ("NOLB", False), ("", False), (None, False),
])
def test_is_up(status, up):
    assert rolling.is_up(status) is up


@pytest.fixture
def unix_server():
    """A UNIX socket server whose one connection does what the test says; yields (path, serve)."""
    directory = short_socket_dir()
    path = os.path.join(directory, "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    received = []

    def serve(behaviour):
        def loop():
            conn, dummy = listener.accept()
            with conn:
                received.append(conn.recv(4096))
                behaviour(conn)
        threading.Thread(target=loop, daemon=True).start()
        return received
    yield path, serve
    listener.close()
    shutil.rmtree(directory, ignore_errors=True)


def test_haproxy_ask_sends_one_line_and_reads_to_the_end(unix_server):
    path, serve = unix_server
    big = "# pxname,svname\n" + "".join("be,s%06d\n" % i for i in range(20000))
    assert len(big) > 3 * 65536

    def answer(conn):
        for i in range(0, len(big), 10000):   # in pieces, as a big `show stat` comes
            conn.sendall(big[i:i + 10000].encode())
    received = serve(answer)
    assert rolling.haproxy_ask(path, "show stat") == big
    assert received == [b"show stat\n"]


def test_haproxy_ask_socket_missing(tmp_path):
    path = str(tmp_path / "none.sock")
    with pytest.raises(RollingError) as exc:
        rolling.haproxy_ask(path, "show stat")
    assert "cannot reach HAProxy's runtime socket %s" % path in str(exc.value)
    assert "No such file or directory" in str(exc.value)


def test_haproxy_ask_silent_socket_times_out_as_a_rolling_error(unix_server):
    path, serve = unix_server
    done = threading.Event()
    serve(lambda conn: done.wait(3))
    try:
        with pytest.raises(RollingError, match="did not answer `show stat`: timed out"):
            rolling.haproxy_ask(path, "show stat", timeout=0.3)
    finally:
        done.set()


# ---------------------------------------------------------------- vLLM

VLLM_PAGE = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1234.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="GLM-4.6"} 2.0
vllm:num_requests_running{engine="1",model_name="GLM-4.6"} 1.0
vllm:num_requests_running{engine="2",model_name="GLM-4.6"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="GLM-4.6"} 0.0
vllm:num_requests_waiting{engine="1",model_name="GLM-4.6"} 4.0
vllm:num_requests_waiting{engine="2",model_name="GLM-4.6"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="GLM-4.6"} 0.31
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="GLM-4.6"} 812.0
"""


def test_in_flight_sums_every_engine_and_ignores_the_rest():
    assert rolling.in_flight(VLLM_PAGE) == {"vllm:num_requests_running": 3.0, "vllm:num_requests_waiting": 5.0}


def test_in_flight_idle_page_is_zero_not_missing():
    idle = VLLM_PAGE.replace(" 2.0\n", " 0.0\n").replace(" 1.0\n", " 0.0\n").replace(" 4.0\n", " 0.0\n")
    assert rolling.in_flight(idle) == {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}


def test_in_flight_reads_the_value_not_a_timestamp_nor_a_spaced_label():
    page = ('vllm:num_requests_running{engine="0",model_name="my model"} 2.0 1717171717000\n'
            'vllm:num_requests_running{engine="1",model_name="a} b"} 1\n'
            "vllm:num_requests_waiting 3.0\n")
    assert rolling.in_flight(page) == {"vllm:num_requests_running": 3.0, "vllm:num_requests_waiting": 3.0}


def test_in_flight_one_metric_alone_counts():
    assert rolling.in_flight('vllm:num_requests_running{engine="0"} 1.0\n') == {"vllm:num_requests_running": 1.0}


@pytest.mark.parametrize("page", [
    "",
    "# HELP node_load1 1m load average.\n# TYPE node_load1 gauge\nnode_load1 0.42\n",
    # near names are not the metric
    'vllm:num_requests_running_total{engine="0"} 4.0\nvllm:num_requests_waiting_by_reason{reason="x"} 1.0\n',
])
def test_in_flight_page_without_the_metrics(page):
    with pytest.raises(RollingError, match="no vllm:num_requests_running or vllm:num_requests_waiting on the page"):
        rolling.in_flight(page)


@pytest.mark.parametrize("line", ['vllm:num_requests_running{engine="0"} lots', "vllm:num_requests_waiting",
                                  'vllm:num_requests_waiting{engine="0" 1.0'])
def test_in_flight_unreadable_line(line):
    with pytest.raises(RollingError, match="unreadable metric line"):
        rolling.in_flight(line + "\n")
