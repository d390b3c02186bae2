"""Jinja filter: the longest legitimate stream, in seconds, from what the deployment allows.

vllm-router's --request-timeout-secs is a total deadline for the whole request (../shared/facts.md: with
4 s, a stream of one chunk per second ended after 4 chunks, HTTP 200, no [DONE]), so it may never be
shorter than the longest answer the deployment serves:

    pdctl_router.longest_stream | pdctl.vllm_pd.longest_stream_s
    {max_output_tokens, tpot_ms, prefill_s, margin} -> ceil((prefill_s + max_output_tokens * tpot_ms / 1000) * margin)
"""
from __future__ import annotations

import math

from ansible.errors import AnsibleFilterError

KEYS = ("max_output_tokens", "tpot_ms", "prefill_s", "margin")


def longest_stream_s(spec):
    if not isinstance(spec, dict) or set(spec) != set(KEYS):
        raise AnsibleFilterError("pdctl_router.longest_stream must have exactly the keys %s, found %r"
                                 % (", ".join(KEYS), spec))
    try:
        values = {k: float(spec[k]) for k in KEYS}
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError("pdctl_router.longest_stream: every value must be a number (%s)" % exc) from exc
    if min(values.values()) <= 0 or values["margin"] < 1:
        raise AnsibleFilterError("pdctl_router.longest_stream: values must be positive and margin >= 1, found %r"
                                 % spec)
    return int(math.ceil((values["prefill_s"] + values["max_output_tokens"] * values["tpot_ms"] / 1000.0)
                         * values["margin"]))


class FilterModule:
    def filters(self):
        return {"longest_stream_s": longest_stream_s}
