#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: instance_canary
short_description: Wait for a started vLLM instance's /health, then judge its answer to a canary
description:
  - Polls the instance's C(/health) until it answers 200, then sends it I(request) (a short completion at
    temperature 0) on C(/v1/completions) until it answers 200, and judges the answer by pdctl's one request-outcome
    rule (module_utils/outcome.py - C(finish_reason) C(length) with exactly the request's C(max_tokens) in the usage,
    or C(stop) with at least one and at most that many; no error in the body), then not empty, and the same as
    I(expect) when given (the answer the same request got on the instance's previous configuration).
  - Fails when C(/health) or the canary never answers 200 in time. A wrong answer does not fail the module - it
    returns RV(ok=false) and RV(msg), so that the caller stops the instance before it fails the play.
  - Call it straight to the instance (on its host), before any router sends it traffic.
options:
  url:
    description: The instance's API base URL (C(http://127.0.0.1:PORT)).
    type: str
    required: true
  api_key:
    description: The key the canary asks with (C(Authorization Bearer)).
    type: str
    required: true
  request:
    description: The C(/v1/completions) request, with C(model).
    type: dict
    required: true
  expect:
    description: The answer the same request got on the previous configuration; empty, none to compare with.
    type: str
    default: ""
  health_timeout:
    description: Seconds to wait at most for C(/health).
    type: int
    default: 2400
  canary_tries:
    description: How many times the canary is sent before the module gives up on a 200.
    type: int
    default: 31
  poll_s:
    description: Seconds between two tries, of C(/health) and of the canary.
    type: float
    default: 2.0
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - pdctl.vllm_pd.attributes
attributes:
  check_mode:
    details: Sends nothing; returns RV(ok=true).
"""

EXAMPLES = r"""
- name: "Canary: prefill-0 answers /health and a short completion, as on its previous configuration"
  pdctl.vllm_pd.instance_canary:
    url: http://127.0.0.1:8100
    api_key: "{{ pdctl_api_key }}"
    request: {prompt: "pdctl canary: the capital of France is", max_tokens: 8, temperature: 0, model: /models/m}
    expect: " Paris."
  register: canary
"""

RETURN = r"""
ok:
  description: The answer lets a router send the instance traffic.
  returned: always
  type: bool
  sample: true
text:
  description: The canary's answer.
  returned: always
  type: str
  sample: " Paris, the city of"
finish_reason:
  description: Why the answer ended (C(length), C(stop)); null without an answer.
  returned: always
  type: str
  sample: length
tokens:
  description: The completion tokens the answer's usage reports; null without an answer or a usage.
  returned: always
  type: int
  sample: 8
msg:
  description: Why the answer is refused; empty when RV(ok).
  returned: always
  type: str
  sample: ""
waited_s:
  description: Seconds from the first C(/health) try to the canary's answer.
  returned: always
  type: float
  sample: 12.5
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.rolling import RollingError, canary_verdict


def _http(url, body=None, api_key=""):
    """(status, parsed JSON or None) of a GET (body None) or a JSON POST; status 0 when nothing answered."""
    headers = {"Content-Type": "application/json", "Authorization": "Bearer %s" % api_key} if body is not None else {}
    try:
        reply = open_url(url, data=None if body is None else json.dumps(body), headers=headers,
                         method="GET" if body is None else "POST", timeout=120)
        status, text = reply.getcode(), reply.read().decode(errors="replace")
    except Exception as exc:  # the URL library raises many kinds; a refused or failed try is tried again
        return getattr(exc, "code", 0) or 0, None
    try:
        return status, json.loads(text) if text.strip() else None
    except ValueError:
        return status, None


def run(params, check_mode, http=_http, clock=time.monotonic, sleep=time.sleep):
    if check_mode:
        return {"changed": False, "ok": True, "text": "", "finish_reason": None, "tokens": None, "msg": "",
                "waited_s": 0.0}
    base = params["url"].rstrip("/")
    start = clock()
    while http(base + "/health")[0] != 200:
        if clock() - start >= params["health_timeout"]:
            raise RollingError("%s/health did not answer 200 within %d s" % (base, params["health_timeout"]))
        sleep(params["poll_s"])
    for attempt in range(params["canary_tries"]):
        status, answer = http(base + "/v1/completions", params["request"], params["api_key"])
        if status == 200:
            out = canary_verdict(answer, params["expect"], (params["request"] or {}).get("max_tokens"))
            return dict(out, changed=False, waited_s=round(clock() - start, 2))
        if attempt + 1 < params["canary_tries"]:
            sleep(params["poll_s"])
    raise RollingError("%s/v1/completions did not answer the canary with 200 in %d tries (last: %s)"
                       % (base, params["canary_tries"], status))


def build_module():
    return AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", required=True, no_log=True),
            request=dict(type="dict", required=True),
            expect=dict(type="str", default=""),
            health_timeout=dict(type="int", default=2400),
            canary_tries=dict(type="int", default=31),
            poll_s=dict(type="float", default=2.0),
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
