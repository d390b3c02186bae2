"""pdctl.lab.faults.AlertWatcher counts only alerts that became active after it started: one still firing from
before the fault (the slow-start profile restarts every engine first, and PdctlPrefillDown fires for that) is not
the fault's (it failed benchmarks/faults.py --ready-after 120 once)."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from pdctl.lab import faults


def _prometheus(alerts):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = json.dumps({"status": "success", "data": {"alerts": alerts}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _stamp(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".123456789Z"


def test_prometheus_nanosecond_times_read_as_wall_seconds():
    assert faults._wall("2026-12-05T21:31:35.123456789Z") == 1796506295.123456
    assert faults._wall("2026-12-05T21:31:35Z") == 1796506295.0


def test_only_alerts_active_since_the_watcher_started_count():
    now = time.time()
    server = _prometheus([
        {"labels": {"alertname": "PdctlPrefillDown"}, "state": "firing", "activeAt": _stamp(now - 60)},
        {"labels": {"alertname": "PdctlDegradedMode"}, "state": "firing", "activeAt": _stamp(now + 1)},
        {"labels": {"alertname": "PdctlRouterDown"}, "state": "pending", "activeAt": _stamp(now + 1)},
    ])
    watcher = faults.AlertWatcher("http://127.0.0.1:%d" % server.server_port)
    watcher.since = now
    watcher.start()
    time.sleep(0.5)
    watcher.stop()
    server.shutdown()
    assert set(watcher.firing) == {"PdctlDegradedMode"}, (watcher.firing, watcher.errors)
