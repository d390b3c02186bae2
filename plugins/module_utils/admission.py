# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Admission follows capacity (issue 41): how many requests a front door admits while only part of the
deployment serves.

A front door admits N requests in flight and queues Q more (roles/frontdoor: its share of
pdctl_frontdoor_max_inflight and frontdoor_max_queue, share()). N is the SLA capacity of the whole plan;
while instances are out (an upgrade, a maintenance turn, a quarantined host) the same N would queue
requests at instances that are not there, and every client would miss the SLA. So it admits the part
that serves:

    f         = min(prefill in service / prefill planned, decode GPUs in service / decode GPUs planned)
    in flight = max(1, floor(N * f))
    queue     = floor(Q * f)

The minimum: a P/D request needs a prefill instance and the decode, and the scarcer of the two bounds
what is served. Decode counts GPUs, not instances: the temporary decode of a release switch or of the
decode host's maintenance runs on one prefill instance's GPUs (4 of 8 on B300). At least one request is
always admitted (HAProxy reads a server maxconn of 0 as no limit at all).

Degraded mode (docs/decode-loss.md: no decode serves, the aggregated routers send whole requests to the
prefill instances) admits the prefill share times a factor below 1 (degraded=), because each prefill
instance then decodes too.

Pure functions of the plan (topology.build_plan) and the limits: the front door role renders them into
HAProxy's configuration, the rolling playbooks set them through HAProxy's runtime API
(pdctl.vllm_pd.frontdoor_admission), and rollout_plan prints them for each step.
"""
from __future__ import annotations

import math
from fractions import Fraction

# The front door role's default queue (roles/frontdoor/defaults/main.yml, frontdoor_max_queue): twice the
# in-flight limit. share() uses it when the inventory does not set frontdoor_max_queue.
DEFAULT_QUEUE_PER_INFLIGHT = 2


class AdmissionError(ValueError):
    pass


def _count(value, what):
    """A whole number of 0 or more (templated values may arrive as text)."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or isinstance(value, bool) or number < 0 or (isinstance(value, float) and number != value):
        raise AdmissionError("%s must be a whole number of 0 or more, not %r" % (what, value))
    return number


def share(frontdoor, max_inflight, max_queue=None):
    """One front door's full limits {'inflight', 'queue', 'hosts'}: the global limits divided among the
    front-door hosts that take clients at once (rounded down; at least one request in flight). With a
    virtual address (frontdoor['vip']) only its holder takes clients, so each host admits the whole.
    max_queue None: the role's default, DEFAULT_QUEUE_PER_INFLIGHT times the in-flight limit."""
    inflight = _count(max_inflight, "the in-flight limit")
    queue = inflight * DEFAULT_QUEUE_PER_INFLIGHT if max_queue is None else _count(max_queue, "the queue limit")
    hosts = 1 if frontdoor.get("vip") else len(frontdoor.get("hosts") or ())
    if hosts < 1:
        raise AdmissionError("the plan has no front-door host to share the limits among")
    return {"inflight": max(1, inflight // hosts), "queue": queue // hosts, "hosts": hosts}


def capacity(plan, without=(), prefill=None, decode=None):
    """What serves, from the plan's instances: {'prefill_in_service', 'prefill_total',
    'decode_gpus_in_service', 'decode_gpus_total'}.

    without: instances out (names or URLs). prefill, decode: the instances the routers send to (URLs or
    names; default: the plan's own). A decode URL that is a prefill instance's is the temporary decode on
    that instance's GPUs: its GPUs count as decode, and it is no prefill instance then."""
    instances = plan.get("instances") or []
    known = {}
    for inst in instances:
        known[inst["name"]] = inst
        if inst.get("url"):
            known[inst["url"]] = inst
    # A quarantined host's prefill instances leave the plan's instances (topology.quarantine) but not its
    # capacity: they count as planned and out.
    absent = {n for q in plan.get("quarantined") or () for n in q.get("instances") or () if n not in known}

    def resolve(refs, what):
        if isinstance(refs, (str, bytes, dict)):
            raise AdmissionError("%s must be a list of instance names or URLs, not %r" % (what, refs))
        refs = [r for r in refs if r not in absent]
        unknown = sorted(str(r) for r in refs if r not in known)
        if unknown:
            raise AdmissionError("%s not in the plan: %s" % (what, ", ".join(unknown)))
        return [known[r]["name"] for r in refs]

    out = set(resolve(without or (), "instances left out"))
    planned_prefill = [i for i in instances if i["pool"] == "prefill"]
    planned_decode = [i for i in instances if i["pool"] == "decode"]
    prefill_names = set(resolve(prefill, "prefill instances")) if prefill is not None else \
        {i["name"] for i in planned_prefill}
    decode_names = set(resolve(decode, "decode instances")) if decode is not None else \
        {i["name"] for i in planned_decode}
    serving_prefill = [i for i in planned_prefill
                       if i["name"] in prefill_names and i["name"] not in decode_names | out]
    serving_decode = [i for i in instances if i["name"] in decode_names - out]
    return {"prefill_in_service": len(serving_prefill), "prefill_total": len(planned_prefill) + len(absent),
            "decode_gpus_in_service": sum(len(i["gpus"]) for i in serving_decode),
            "decode_gpus_total": sum(len(i["gpus"]) for i in planned_decode)}


def fraction(cap, degraded=None):
    """The share of the plan that serves (a Fraction in [0, 1]); with degraded (the factor), the
    degraded mode's: the prefill share times that factor."""
    served = {}
    for key in ("prefill", "decode_gpus"):
        now = _count(cap.get(key + "_in_service"), key + "_in_service")
        total = _count(cap.get(key + "_total"), key + "_total")
        if total == 0:
            raise AdmissionError("the plan has no %s: nothing to scale admission by" % key.replace("_", " "))
        if now > total:
            raise AdmissionError("%s in service (%d) is more than planned (%d)" % (key.replace("_", " "), now, total))
        served[key] = Fraction(now, total)
    if degraded is None:
        return min(served.values())
    factor = Fraction(str(degraded))
    if not 0 < factor <= 1:
        raise AdmissionError("the degraded admission factor must be above 0 and at most 1, not %s" % degraded)
    return served["prefill"] * factor


def limits(full, cap, degraded=None):
    """{'inflight', 'queue', 'fraction'}: the full limits ({'inflight', 'queue'}, share()) scaled to what
    serves (capacity()); degraded: see fraction()."""
    f = fraction(cap, degraded)
    inflight = _count(full.get("inflight"), "the full in-flight limit")
    queue = _count(full.get("queue"), "the full queue limit")
    return {"inflight": max(1, math.floor(inflight * f)), "queue": math.floor(queue * f),
            "fraction": round(float(f), 4)}
