"""The lab's background servers are one per machine: a second checkout takes them over cleanly (and
says so) instead of talking to the first checkout's, and a port held by a stranger is an error."""
import socket
import sys

import pytest

from pdctl.lab import daemon


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server(port, tag):
    """A tiny HTTP server that answers with its tag (which checkout started it)."""
    code = ("import http.server, sys\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        self.send_response(200); self.end_headers(); self.wfile.write(sys.argv[2].encode())\n"
            "    def log_message(self, *a): pass\n"
            "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")
    return [sys.executable, "-c", code, str(port), tag]


@pytest.fixture
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    yield tmp_path
    for lab in ("first", "second"):
        daemon.stop(tmp_path / lab, "probe")


def read(url):
    import urllib.request

    with urllib.request.urlopen(url, timeout=60) as resp:
        return resp.read().decode()


def test_a_second_checkout_takes_the_server_over(registry, capsys):
    first, second = registry / "first", registry / "second"
    first.mkdir()
    second.mkdir()
    port = free_port()
    url = "http://127.0.0.1:%d/" % port
    assert daemon.start(first, "probe", server(port, "first"), url) is True
    assert read(url) == "first"
    assert daemon.start(first, "probe", server(port, "first"), url) is False  # already ours: left alone
    first_pid = daemon.running_pid(first, "probe")
    assert daemon.start(second, "probe", server(port, "second"), url) is True
    assert read(url) == "second"
    assert "taking the probe over from the checkout at %s" % registry in capsys.readouterr().out
    assert daemon.running_pid(first, "probe") is None and not daemon._alive(first_pid)
    assert daemon.running_pid(second, "probe")


def test_a_port_held_by_a_stranger_is_an_error_naming_the_log(registry):
    lab = registry / "first"
    lab.mkdir()
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        with pytest.raises(RuntimeError, match="probe exited .* before serving; see .*probe.log"):
            daemon.start(lab, "probe", server(port, "first"), "http://127.0.0.1:%d/" % port, timeout=60)


@pytest.mark.parametrize("recorded", ["12345", None], ids=["another-start-time", "no-start-time"])
def test_a_recorded_pid_now_held_by_another_process_is_left_alone(registry, recorded):
    """The server recorded by another checkout died and its pid went to an unrelated process (pids wrap
    around): starting ours must not stop that process, and the registry must not report it as the server."""
    import json
    import subprocess

    lab = registry / "first"
    lab.mkdir()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        entry = {"pid": bystander.pid, "lab_dir": str(registry / "gone" / ".lab")}
        if recorded:
            entry["start_time"] = recorded
        (daemon.registry_dir() / "probe.json").write_text(json.dumps(entry))
        assert daemon.owner("probe") is None
        port = free_port()
        url = "http://127.0.0.1:%d/" % port
        assert daemon.start(lab, "probe", server(port, "first"), url) is True
        assert read(url) == "first"
        assert bystander.poll() is None, "a process that only reused the recorded pid was stopped"
        assert daemon.owner("probe")["pid"] == daemon.running_pid(lab, "probe") != bystander.pid
    finally:
        bystander.kill()
        bystander.wait()
