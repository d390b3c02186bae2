#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: frontdoor_server
short_description: Put a router in or out of the front door's rotation without dropping a request
description:
  - Sets the admin state of one server of the front door (HAProxy) through its runtime API, as a rolling
    upgrade needs it, and optionally waits for the result.
  - C(state=ready) takes it into the rotation (its health checks must pass before HAProxy sends to it);
    C(state=drain) sends it no new request while the ones it has finish; C(state=maint) takes it out
    entirely (no health checks either).
  - C(wait=up) waits until its health checks pass; C(wait=idle) waits until it has no request in flight
    (HAProxy's current sessions of that server).
  - The state lives in the running HAProxy only; a restart or reload returns every server to its
    configured state (the standby routers are configured C(disabled)).
  - The admin state is read from C(show servers state) (its C(srv_admin_state) bits), not from the
    status of C(show stat), where a drained server whose checks fail reads C(DOWN) like a ready one.
options:
  backend:
    description: The HAProxy backend.
    type: str
    default: be_routers
  server:
    description: The server in that backend (the front door names routers by host, standbys C(HOST-standby)).
    type: str
    required: true
  state:
    description: Admin state to set; left as it is when omitted (to wait only).
    type: str
    choices: [ready, drain, maint]
  wait:
    description: What to wait for after setting the state.
    type: str
    choices: [none, up, idle]
    default: none
  timeout:
    description: Seconds to wait at most; the module fails naming the server and what it last saw.
    type: int
    default: 300
  drain_first:
    description:
      - With O(state=maint), a server in rotation is first drained and taken out once it has no request
        in flight (bounded by O(timeout)); a server already in maintenance is left alone (no change).
    type: bool
    default: false
  check_decode:
    description:
      - URL of the decode instance this P/D router sends to (C(http://HOST:PORT)). The server of a P/D router
        tracks a check-only backend, C(be_check_SERVER), that asks the router's C(/readiness) and the decode's
        C(/health); this points the latter at the given decode (its check address and port), as a release
        switch needs while the router pairs with the temporary decode. Left as it is when omitted.
      - Like the admin state, it lives in the running HAProxy only; a reload returns it to the plan's decode.
    type: str
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - pdctl.vllm_pd.attributes
  - pdctl.vllm_pd.frontdoor_socket
attributes:
  check_mode:
    details: Reports whether the state would change; sets nothing and does not wait.
"""

EXAMPLES = r"""
- name: The standby router takes traffic once healthy
  pdctl.vllm_pd.frontdoor_server:
    server: lab-decode-0-standby
    state: ready
    wait: up
    timeout: 60

- name: The router pairs with the temporary decode; its check follows
  pdctl.vllm_pd.frontdoor_server:
    server: lab-decode-0
    check_decode: http://10.89.64.11:8101
    wait: up
    timeout: 60

- name: The router finishes its streams and gets no new ones
  pdctl.vllm_pd.frontdoor_server:
    server: lab-decode-0
    state: drain
    wait: idle
"""

RETURN = r"""
previous_state:
  description: Admin state before (ready, drain or maint).
  returned: always
  type: str
  sample: maint
status:
  description: HAProxy's status column for the server at the end (UP, DOWN, DRAIN, MAINT, ...).
  returned: always
  type: str
  sample: UP
sessions:
  description: Requests in flight at that server at the end.
  returned: always
  type: int
  sample: 0
check_decode_previous:
  description: The decode the router's check asked before (with O(check_decode) only).
  returned: when O(check_decode) is given
  type: str
  sample: http://10.89.64.13:8100
waited_s:
  description: Seconds spent waiting.
  returned: always
  type: float
  sample: 2.1
"""

import time
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.rolling import (
    RollingError, admin_state, haproxy_ask, haproxy_do, is_up, parse_servers_state, parse_stat, server_row)


def _row(sock, backend, server):
    return server_row(parse_stat(haproxy_ask(sock, "show stat")), backend, server)


def _admin_state(sock, backend, server):
    """From the admin bits, not from `show stat`'s status: a drained server whose checks fail (a stopped
    router) reads DOWN there, and taking that for ready would leave it drained on `state=ready`."""
    for row in parse_servers_state(haproxy_ask(sock, "show servers state %s" % backend)):
        if row.get("srv_name") == server:
            return admin_state(row.get("srv_admin_state"))
    raise RollingError("HAProxy's `show servers state %s` has no server %s" % (backend, server))


def _reached(row, wait):
    if wait == "up":
        return is_up(row["status"])
    if wait == "idle":
        return int(row.get("scur") or 0) == 0
    return True


def _check_decode(sock, server, url):
    """((addr, port) the router's check asks now, (addr, port) wanted) for check_decode."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise RollingError("check_decode must be http://HOST:PORT, got %r" % url)
    backend = "be_check_%s" % server
    answer = haproxy_ask(sock, "show servers state %s" % backend)
    rows = [] if answer.startswith("Can't find backend") else parse_servers_state(answer)
    row = next((r for r in rows if r.get("srv_name") == "router"), None)
    if row is None:
        raise RollingError("HAProxy has no check backend %s for %s (only a P/D router's server tracks one)"
                           % (backend, server))
    return (row.get("srv_check_addr"), int(row.get("srv_check_port") or 0)), (parts.hostname, parts.port)


def _set(sock, backend, server, state):
    haproxy_do(sock, "set server %s/%s state %s" % (backend, server, state))


def _wait(sock, backend, server, wait, timeout):
    """Poll until `wait` holds; return the last row and the seconds spent polling (0 if it held at once)."""
    start = time.monotonic()
    deadline = start + timeout
    row = _row(sock, backend, server)
    waited = 0.0
    while not _reached(row, wait):
        if time.monotonic() >= deadline:
            raise RollingError("%s/%s did not become %s within %d s (status %s, %s request(s) in flight)"
                               % (backend, server, wait, timeout, row["status"], row.get("scur")))
        time.sleep(0.5)
        row = _row(sock, backend, server)
        waited = time.monotonic() - start
    return row, waited


def run(params, check_mode):
    sock, backend, server = params["socket"], params["backend"], params["server"]
    row = _row(sock, backend, server)
    previous = _admin_state(sock, backend, server)
    changed = params["state"] is not None and params["state"] != previous
    result = {"changed": changed, "previous_state": previous, "status": row["status"],
              "sessions": int(row.get("scur") or 0), "waited_s": 0.0}
    check_now = check_wanted = None
    if params["check_decode"]:
        check_now, check_wanted = _check_decode(sock, server, params["check_decode"])
        result.update(check_decode_previous="http://%s:%d" % check_now, changed=changed or check_now != check_wanted)
    if check_mode:
        return result
    if check_now != check_wanted:
        haproxy_do(sock, "set server be_check_%s/router check-addr %s port %d" % ((server,) + check_wanted))
    drained = 0.0
    if changed and params["state"] == "maint" and params["drain_first"]:
        # Out of rotation without cutting a stream: drained first (or still draining from a run that
        # was interrupted), in maintenance once idle.
        if previous == "ready":
            _set(sock, backend, server, "drain")
        drained = _wait(sock, backend, server, "idle", params["timeout"])[1]
    if changed:
        _set(sock, backend, server, params["state"])
    row, waited = _wait(sock, backend, server, params["wait"], params["timeout"])
    result.update(status=row["status"], sessions=int(row.get("scur") or 0), waited_s=round(drained + waited, 2))
    return result


def build_module():
    return AnsibleModule(
        argument_spec=dict(
            backend=dict(type="str", default="be_routers"),
            server=dict(type="str", required=True),
            state=dict(type="str", choices=["ready", "drain", "maint"]),
            wait=dict(type="str", choices=["none", "up", "idle"], default="none"),
            timeout=dict(type="int", default=300),
            drain_first=dict(type="bool", default=False),
            check_decode=dict(type="str"),
            socket=dict(type="path", default="/run/haproxy/admin.sock"),
        ),
        supports_check_mode=True,
    )


def main():
    module = build_module()
    try:
        module.exit_json(**run(module.params, module.check_mode))
    except RollingError as exc:
        module.fail_json(msg=str(exc))


if __name__ == "__main__":
    main()
