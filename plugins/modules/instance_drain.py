#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: instance_drain
short_description: Wait until a vLLM instance has no request in hand
description:
  - Polls the instance's Prometheus page and sums C(vllm:num_requests_running) and
    C(vllm:num_requests_waiting) over every engine (DP rank). Returns once the sum has stayed 0 for
    I(settle_s) seconds (a P/D request's decode leg follows its prefill leg; the KV pull in between
    shows on no counter, so the quiet has to last a little), or fails after I(timeout) seconds naming
    what is still in flight.
  - Call it after the routers stopped sending to the instance (C(frontdoor_server)), before stopping it.
  - Read-only.
options:
  url:
    description: The instance's metrics URL.
    type: str
    required: true
  settle_s:
    description: Seconds the instance must stay idle.
    type: float
    default: 2.0
  timeout:
    description: Seconds to wait at most.
    type: int
    default: 600
  poll_s:
    description: Seconds between two reads.
    type: float
    default: 0.5
  stopped_ok:
    description:
      - An instance that refuses the connection (stopped) has nothing in flight; report it drained with
        I(stopped=true) instead of failing. A re-run of an interrupted upgrade meets instances it stopped.
      - Any other read failure (a timeout, a refused page) still fails.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - pdctl.vllm_pd.attributes
attributes:
  check_mode:
    details: Reads once and reports; does not wait.
"""

EXAMPLES = r"""
- name: Prefill-0 has finished what it had
  pdctl.vllm_pd.instance_drain:
    url: http://127.0.0.1:8100/metrics
    timeout: 330
"""

RETURN = r"""
running:
  description: Requests running at the last read (all engines).
  returned: always
  type: int
  sample: 0
waiting:
  description: Requests waiting at the last read (all engines).
  returned: always
  type: int
  sample: 0
stopped:
  description: The instance refused the connection (I(stopped_ok)); nothing was in flight.
  returned: always
  type: bool
  sample: false
waited_s:
  description: Seconds spent waiting.
  returned: always
  type: float
  sample: 3.5
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.rolling import RollingError, in_flight


class InstanceStopped(RollingError):
    """The instance refused the connection: no process listens, nothing is in flight."""


def _read(url):
    try:
        text = open_url(url, timeout=10).read().decode(errors="replace")
    except Exception as exc:  # the URL library raises many kinds; each is the same failure here
        if isinstance(getattr(exc, "reason", exc), ConnectionRefusedError):
            raise InstanceStopped("cannot read %s: connection refused" % url)
        raise RollingError("cannot read %s: %s" % (url, exc))
    try:
        totals = in_flight(text)
    except RollingError as exc:
        raise RollingError("%s: %s" % (url, exc))
    return int(totals.get("vllm:num_requests_running", 0)), int(totals.get("vllm:num_requests_waiting", 0))


def run(params, check_mode, read=_read, clock=time.monotonic, sleep=time.sleep):
    start = sent = clock()
    try:
        running, waiting = read(params["url"])
    except InstanceStopped:
        if not params.get("stopped_ok"):
            raise
        return {"changed": False, "running": 0, "waiting": 0, "stopped": True, "waited_s": 0.0}
    if check_mode:
        return {"changed": False, "running": running, "waiting": waiting, "stopped": False, "waited_s": 0.0}
    # Settled when a read sent settle_s or more after a quiet read came back is still quiet. Each read
    # sees the instance at some moment between its send and its reply, so only this pairing proves
    # settle_s of quiet, also when a slow read or a late wake-up outlasts settle_s by itself (in CI, a
    # quiet begun at the first quiet read's send was confirmed after 0.24 s of a 0.5 s settle_s).
    quiet_since = clock() if running + waiting == 0 else None
    while quiet_since is None or sent - quiet_since < params["settle_s"]:
        if clock() - start >= params["timeout"]:
            raise RollingError("%s still has %d request(s) running and %d waiting after %d s: has every router "
                               "stopped sending to it?" % (params["url"], running, waiting, params["timeout"]))
        sleep(params["poll_s"])
        sent = clock()
        running, waiting = read(params["url"])
        if running + waiting:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = clock()
    return {"changed": False, "running": running, "waiting": waiting, "stopped": False,
            "waited_s": round(clock() - start, 2)}


def build_module():
    return AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            settle_s=dict(type="float", default=2.0),
            timeout=dict(type="int", default=600),
            poll_s=dict(type="float", default=0.5),
            stopped_ok=dict(type="bool", default=False),
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
