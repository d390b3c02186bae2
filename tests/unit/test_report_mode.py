"""`pdctl report` names the serving mode from each front door's router checks (issue 39)."""
import http.server
import threading

from pdctl import report


def _metrics(states):
    lines = []
    for server, up in states.items():
        for state in ("DOWN", "UP", "MAINT"):
            value = 1 if (state == "UP") == up else 0
            lines.append('haproxy_server_status{proxy="be_routers",server="%s",state="%s"} %d' % (server, state, value))
    lines.append('haproxy_server_status{proxy="be_admission",server="admission",state="UP"} 1')
    return "\n".join(lines) + "\n"


PD = {"lab-decode-0": True, "lab-prefill-0": True, "lab-decode-0-aggregated": True, "lab-prefill-0-aggregated": True}
DEGRADED = {"lab-decode-0": False, "lab-prefill-0": False, "lab-decode-0-aggregated": False,
            "lab-prefill-0-aggregated": True}
DOWN = {name: False for name in PD}


def test_modes_from_the_router_servers_up():
    assert report.serving_mode(_metrics(PD))[0] == "pd"
    assert report.serving_mode(_metrics(DEGRADED)) == ("aggregated", ["lab-prefill-0-aggregated"])
    assert report.serving_mode(_metrics(DOWN)) == ("down", [])
    # The admission server (another backend) is not a router.
    assert report.serving_mode(_metrics({})) == ("down", [])


def test_each_front_door_is_read_and_an_unreachable_one_is_named():
    body = _metrics(DEGRADED).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        plan = {"frontdoor": {"hosts": ["fd-0", "fd-1"], "addresses": ["127.0.0.1", "127.0.0.2"], "metrics_port": port,
                              "url": "https://192.0.2.10:443", "vip": {"address": "192.0.2.10"}}}
        lines = list(report.mode_lines(plan, timeout=1))
    finally:
        server.shutdown()
    assert lines[0].startswith("clients: https://192.0.2.10:443 (virtual address")
    assert lines[1].startswith("fd-0") and "DEGRADED" in lines[1] and "lab-prefill-0-aggregated" in lines[1]
    assert lines[2].startswith("fd-1") and "UNKNOWN" in lines[2]
