"""Two routers behind the front door (issue 14, acceptance 5): with a steady load through the front
door, the router carrying it stops; requests that start once HAProxy's health check has noticed all
succeed, and the only failures allowed are the streams that were in flight on it (counted)."""
import time

import pytest

from pdctl.lab.load import StreamLoad
from test_serving import CA, FRONTDOOR, client_key, on_host

pytestmark = [pytest.mark.lab, pytest.mark.slow]

# The router that carries the traffic: the front door on lab-decode-0 lists its own router first.
STOPPED = "lab-decode-0"


def _frontdoor_servers(aggregated=False):
    """HAProxy's view of the router servers: {name: status} from its runtime socket; with aggregated, also the
    aggregated routers (degraded mode, docs/decode-loss.md)."""
    out = on_host("lab-decode-0", "sh", "-c", "echo 'show stat' | socat stdio /run/haproxy/admin.sock 2>/dev/null"
                  " || echo 'show stat' | python3 -c \"import socket,sys; s=socket.socket(socket.AF_UNIX);"
                  " s.connect('/run/haproxy/admin.sock'); s.sendall(sys.stdin.buffer.read());"
                  " print(s.makefile().read())\"")
    rows = [line.split(",") for line in out.splitlines() if line.startswith("be_routers,")]
    return {r[1]: r[17] for r in rows if r[1] not in ("BACKEND", "FRONTEND") and (aggregated or not r[1].endswith("-aggregated"))}


def _routers_in_rotation():
    """The routers proper (each router's standby is out of rotation except during an upgrade)."""
    return {name: status for name, status in _frontdoor_servers().items() if not name.endswith("-standby")}


@pytest.fixture
def stopped_router(converged_lab):
    """The lab's inventory runs a router on lab-decode-0 and lab-prefill-0 (issue 39); the one that carries the
    traffic is stopped by the test and started again here."""
    yield STOPPED
    on_host(STOPPED, "systemctl", "start", "pdctl-router.service")
    deadline = time.monotonic() + 60
    while _frontdoor_servers().get(STOPPED) != "UP":
        assert time.monotonic() < deadline, "the router never came back: %s" % _frontdoor_servers()
        time.sleep(1)


def test_front_door_keeps_serving_when_one_of_two_routers_stops(stopped_router):
    deadline = time.monotonic() + 30
    while set(_routers_in_rotation().values()) != {"UP"} or len(_routers_in_rotation()) != 2:
        assert time.monotonic() < deadline, "both routers never came up at the front door: %s" % _frontdoor_servers()
        time.sleep(1)
    with StreamLoad(FRONTDOOR, client_key(), clients=8, max_tokens=48, verify=CA) as load:
        time.sleep(5)
        stopped_at = time.monotonic()
        on_host(STOPPED, "systemctl", "kill", "-s", "KILL", "pdctl-router.service")
        on_host(STOPPED, "systemctl", "stop", "pdctl-router.service")
        while _frontdoor_servers().get(STOPPED) == "UP":
            assert time.monotonic() - stopped_at < 30, "the front door never noticed the stopped router"
            time.sleep(0.2)
        noticed_s = time.monotonic() - stopped_at
        time.sleep(10)
    summary = load.summary()
    after = [o for o in load.outcomes if o.start > stopped_at + noticed_s]
    in_flight = [o for o in load.outcomes if o.start < stopped_at < o.end]
    print("the front door's router killed: %s; noticed in %.1f s; %d requests after, %d in flight at the kill"
          % (summary, noticed_s, len(after), len(in_flight)))
    assert len(after) >= 20, summary
    assert all(o.ok for o in after), "requests after the health check noticed failed: %s" % summary
    # Only the streams in flight on the killed router may fail.
    assert summary["failed_requests"] <= len(in_flight), summary
    # The next router in the front door's order took the requests: this host's aggregated router (the
    # other host's P/D router comes after it, haproxy.cfg.j2 says why).
    assert _frontdoor_servers(aggregated=True)["lab-decode-0-aggregated"] == "UP"
