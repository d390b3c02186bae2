"""Two routers behind the front door (issue 14, acceptance 5): with a steady load through the front
door, one router stops; requests that start once HAProxy's health check has noticed all succeed, and
the only failures allowed are the streams that were in flight on the stopped router (counted)."""
import time

import pytest
import yaml

from conftest import LAB_ENV
from inventories import ROOT, inventory_variant
from pdctl import runner
from pdctl.lab.load import StreamLoad
from test_serving import CA, FRONTDOOR, client_key, on_host

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SECOND = "lab-prefill-0"  # the second router; the first stays on lab-decode-0 beside the front door
TAGS = "router,frontdoor,firewall"


def _with_second_router(tmp_path):
    hosts = yaml.safe_load((ROOT / "inventories/lab/hosts.yml").read_text())
    hosts["all"]["children"]["router"]["hosts"][SECOND] = None
    return inventory_variant(tmp_path / "two-routers", {"hosts": hosts})


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
def two_routers(converged_lab, tmp_path):
    inv = _with_second_router(tmp_path)
    result = runner.run_playbook("site.yml", inv, tags=TAGS, envvars=LAB_ENV)
    assert result.ok, result.failures
    yield inv
    # Back to one router: the second host's router goes (unit and its key), the front door and the
    # firewalls forget it.
    on_host(SECOND, "systemctl", "disable", "--now", "pdctl-router.service", "pdctl-router-aggregated.service")
    on_host(SECOND, "rm", "-f", "/etc/systemd/system/pdctl-router.service",
            "/etc/systemd/system/pdctl-router-aggregated.service", "/etc/pdctl/router-secrets.env")
    on_host(SECOND, "systemctl", "daemon-reload")
    result = runner.run_playbook("site.yml", ROOT / "inventories/lab", tags=TAGS, envvars=LAB_ENV)
    assert result.ok, result.failures


def test_front_door_keeps_serving_when_one_of_two_routers_stops(two_routers):
    deadline = time.monotonic() + 30
    while set(_routers_in_rotation().values()) != {"UP"} or len(_routers_in_rotation()) != 2:
        assert time.monotonic() < deadline, "both routers never came up at the front door: %s" % _frontdoor_servers()
        time.sleep(1)
    with StreamLoad(FRONTDOOR, client_key(), clients=8, max_tokens=48, verify=CA) as load:
        time.sleep(5)
        stopped_at = time.monotonic()
        on_host(SECOND, "systemctl", "kill", "-s", "KILL", "pdctl-router.service")
        on_host(SECOND, "systemctl", "stop", "pdctl-router.service")
        while _frontdoor_servers().get(SECOND) == "UP":
            assert time.monotonic() - stopped_at < 30, "the front door never noticed the stopped router"
            time.sleep(0.2)
        noticed_s = time.monotonic() - stopped_at
        time.sleep(10)
    summary = load.summary()
    after = [o for o in load.outcomes if o.start > stopped_at + noticed_s]
    in_flight = [o for o in load.outcomes if o.start < stopped_at < o.end]
    print("second router killed: %s; noticed in %.1f s; %d requests after, %d in flight at the kill"
          % (summary, noticed_s, len(after), len(in_flight)))
    assert len(after) >= 20, summary
    assert all(o.ok for o in after), "requests after the health check noticed failed: %s" % summary
    # Only the streams in flight on the killed router (about half of those in flight) may fail.
    assert summary["failed_requests"] <= len(in_flight), summary
    assert _frontdoor_servers()["lab-decode-0"] == "UP"
