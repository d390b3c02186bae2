#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: frontdoor_admission
short_description: Set the front door's in-flight limit and queue bound through HAProxy's runtime API
description:
  - The front door (HAProxy) admits requests through one server, C(admission), of an admission backend. Its
    C(maxconn) is the in-flight limit, and a process-wide variable bounds the queue (a request that finds no
    free slot and that many others waiting gets 503 at once). This module sets both in the running HAProxy, without a reload,
    so that admission follows what serves while instances are out (pdctl.vllm_pd's admission rule,
    C(plugins/module_utils/admission.py), computes the values).
  - Reads the current values first (C(show stat)'s C(slim) for the server's maxconn, C(get var) for the
    variable) and changes only what differs.
  - The values live in the running HAProxy only; a reload or restart returns both to the configuration's.
  - Requests already in flight above a lowered limit finish; new ones wait until the count is below it.
options:
  inflight:
    description: Requests in flight at once through the admission server (its maxconn), at least 1.
    type: int
    required: true
  queue:
    description: Requests that may wait for a slot; 0 answers 503 at once to a request that finds no free slot.
    type: int
    required: true
  lower_only:
    description:
      - Only lower the limits; a value already at or below the given one is left as it is. For the step before a
        traffic move to something that serves less, when the run does not know what the front door admits now.
    type: bool
    default: false
  backend:
    description: The admission backend (C(be_admission); C(be_admission_degraded) in degraded mode).
    type: str
    default: be_admission
  server:
    description: The admission server in that backend.
    type: str
    default: admission
  queue_var:
    description:
      - The process-wide variable the backend's queue bound is read from (C(proc.NAME)); the configuration sets it
        (C(set-var) in C(global)), so the module refuses one the running HAProxy does not know.
    type: str
    default: proc.pdctl_admission_queue
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - pdctl.vllm_pd.attributes
  - pdctl.vllm_pd.frontdoor_socket
attributes:
  check_mode:
    details: Reads the current values and reports what would change; sets nothing.
  diff_mode:
    support: full
    details: The in-flight limit and the queue bound, before and after.
"""

EXAMPLES = r"""
- name: A release switch's pair phase serves 1 of 4 prefill instances
  pdctl.vllm_pd.frontdoor_admission:
    inflight: 16
    queue: 32

- name: Before a move to the standby routers, never admit more than they serve
  pdctl.vllm_pd.frontdoor_admission:
    inflight: 48
    queue: 96
    lower_only: true

- name: The degraded mode's admission (aggregated routers only)
  pdctl.vllm_pd.frontdoor_admission:
    backend: be_admission_degraded
    queue_var: proc.pdctl_admission_degraded_queue
    inflight: 32
    queue: 64
"""

RETURN = r"""
inflight:
  description: The in-flight limit at the end (in check mode, what it would be).
  returned: always
  type: int
  sample: 16
queue:
  description: The queue bound at the end (in check mode, what it would be).
  returned: always
  type: int
  sample: 32
inflight_previous:
  description: The in-flight limit before.
  returned: always
  type: int
  sample: 64
queue_previous:
  description: The queue bound before.
  returned: always
  type: int
  sample: 128
sessions:
  description: Requests in flight through the admission server when the module read it.
  returned: always
  type: int
  sample: 12
queued:
  description: Requests waiting for a slot (the backend's queue and the server's) when the module read it.
  returned: always
  type: int
  sample: 0
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.rolling import (
    RollingError, haproxy_ask, haproxy_do, haproxy_get_var, haproxy_set_var, parse_stat, server_row)


def _int(text, what):
    try:
        return int(text)
    except (TypeError, ValueError):
        raise RollingError("HAProxy's %s is not a number: %r" % (what, text))


def read(sock, backend, server, queue_var):
    """(in-flight limit, queue bound, sessions, queued) as the running HAProxy has them. A request that waits
    for a slot of the one server waits in the backend's queue (no persistence): queued counts both."""
    rows = parse_stat(haproxy_ask(sock, "show stat"))
    row, total = server_row(rows, backend, server), server_row(rows, backend, "BACKEND")
    queue = haproxy_get_var(sock, queue_var)
    if queue is None:
        raise RollingError("the running HAProxy has no variable %s (its configuration predates admission that "
                           "follows capacity): deploy the front door first (site.yml --tags frontdoor)" % queue_var)
    return (_int(row.get("slim"), "maxconn of %s/%s (slim)" % (backend, server)), _int(queue, queue_var),
            _int(row.get("scur") or 0, "scur"),
            _int(row.get("qcur") or 0, "qcur") + _int(total.get("qcur") or 0, "qcur of %s" % backend))


def run(params, check_mode):
    sock, backend, server, var = params["socket"], params["backend"], params["server"], params["queue_var"]
    if params["inflight"] < 1:
        # HAProxy reads a server maxconn of 0 as no limit at all.
        raise RollingError("inflight must be at least 1, got %d" % params["inflight"])
    if params["queue"] < 0:
        raise RollingError("queue must be 0 or more, got %d" % params["queue"])
    if not var.startswith("proc.") or not var[5:].replace("_", "").replace(".", "").isalnum():
        raise RollingError("queue_var must be a process-wide variable, proc.NAME, got %r" % var)
    inflight_now, queue_now, sessions, queued = read(sock, backend, server, var)
    inflight, queue = params["inflight"], params["queue"]
    if params["lower_only"]:
        inflight, queue = min(inflight, inflight_now), min(queue, queue_now)
    result = {"changed": (inflight, queue) != (inflight_now, queue_now), "inflight": inflight, "queue": queue,
              "inflight_previous": inflight_now, "queue_previous": queue_now, "sessions": sessions, "queued": queued,
              "diff": {"before": "%s/%s: %d in flight, queue %d\n" % (backend, server, inflight_now, queue_now),
                       "after": "%s/%s: %d in flight, queue %d\n" % (backend, server, inflight, queue)}}
    if check_mode or not result["changed"]:
        return result

    def set_queue():
        haproxy_set_var(sock, var, "int(%d)" % queue)

    def set_inflight():
        haproxy_do(sock, "set maxconn server %s/%s %d" % (backend, server, inflight))

    # Growing, the slots open before more requests may wait; shrinking, the queue shrinks before fewer slots
    # send more requests to it.
    order = [(inflight_now, inflight, set_inflight), (queue_now, queue, set_queue)]
    for now, wanted, apply in order if inflight > inflight_now else reversed(order):
        if now != wanted:
            apply()
    inflight_set, queue_set = read(sock, backend, server, var)[:2]
    if (inflight_set, queue_set) != (inflight, queue):
        raise RollingError("HAProxy took the commands but reads %d in flight, queue %d for %s/%s (wanted %d, %d)"
                           % (inflight_set, queue_set, backend, server, inflight, queue))
    return result


def build_module():
    return AnsibleModule(
        argument_spec=dict(
            inflight=dict(type="int", required=True),
            queue=dict(type="int", required=True),
            lower_only=dict(type="bool", default=False),
            backend=dict(type="str", default="be_admission"),
            server=dict(type="str", default="admission"),
            queue_var=dict(type="str", default="proc.pdctl_admission_queue"),
            socket=dict(type="path", default="/run/haproxy/admin.sock"),
        ),
        supports_check_mode=True,
    )


def main():
    module = build_module()
    try:
        result = run(module.params, module.check_mode)
    except RollingError as exc:
        module.fail_json(msg="%s (front door socket %s)" % (exc, module.params["socket"]))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
