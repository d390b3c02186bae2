"""Jinja filters over the admission rule (plugins/module_utils/admission.py): a front door's limits for
what serves.

    frontdoor_plan | pdctl.vllm_pd.admission_share(max_inflight, max_queue)   -> {inflight, queue, hosts}
    preflight_plan | pdctl.vllm_pd.admission_capacity(without=[...], prefill=[...], decode=[...])
        -> {prefill_in_service, prefill_total, decode_gpus_in_service, decode_gpus_total}
    full_limits | pdctl.vllm_pd.admission_limits(capacity, degraded=0.5)     -> {inflight, queue, fraction}
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import admission


def _wrap(function):
    def call(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except admission.AdmissionError as exc:
            raise AnsibleFilterError("admission: %s" % exc) from exc
    call.__doc__ = function.__doc__
    return call


class FilterModule:
    def filters(self):
        return {"admission_share": _wrap(admission.share), "admission_capacity": _wrap(admission.capacity),
                "admission_limits": _wrap(admission.limits)}
