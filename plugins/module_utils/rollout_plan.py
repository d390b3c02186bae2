# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The steps of a rollout, the serving capacity at each, and how long each takes (issue 41).

Pure functions of the serving plan (topology.build_plan), what is to change and the inventory's timing
model (`pdctl_rollout_timing`): `pdctl upgrade --check` / `pdctl maintain --check` print them, and the
playbooks print the same steps for what the hosts actually have to do. The steps follow the playbooks
(docs/upgrades.md, docs/maintenance.md); a step's seconds are the sum of the timing model's parts it
waits on, in the order the playbook waits on them.

Capacity is what new requests can reach while the step runs: prefill instances in service, and GPUs
of the decode instances in service (the temporary decode's during a release switch or the decode host's
maintenance). Given the front door's full limits (admission=, admission.share()), each step also says what
the front door admits while it runs (admission.limits(): admission follows capacity).
"""
from __future__ import annotations

import math

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import admission as adm

KINDS = ("prefill", "release", "maintenance")

# Every part of the timing model, in seconds. `drain_s` is what the estimate counts for one wait on
# streams in flight; `drain_bound_s` is the longest such a wait may last (the longest stream the SLA
# allows): the estimate's upper figure counts every drain at its bound. The front door's moves are the
# drains (roles/traffic: frontdoor_away waits for the routers' streams, frontdoor_home for the standbys'); an
# instance stops only after the routers that sent to it have drained, so its own idle check is part of
# `engine_stop_s`.
TIMING_KEYS = {
    "run_s": "a run's fixed work: preflight, reading the hosts, checking every argv, writing units",
    "release_stage_s": "installing a new release's venv on every host (in parallel)",
    "router_ready_s": "a router or its standby (re)starts and answers /health (the upgrade's plays restart every "
                      "router host's at once; maintenance and a decode change one router host after the other)",
    "frontdoor_s": "the front door moves between routers and standbys (runtime API, health checks)",
    "drain_s": "one wait for the streams in flight to finish (expected): every move of the front door waits for "
               "the streams of the routers (or standbys) it left",
    "drain_bound_s": "one wait for the streams in flight to finish (at most)",
    "engine_stop_s": "an instance stops: its own idle check (the routers it served have drained) and the stop",
    "engine_ready_s": "an instance starts until /health answers (model load, compile, CUDA graphs)",
    "canary_s": "one canary request",
    "gates_s": "the SLA and accuracy gates through the front door",
    "host_stack_s": "maintenance: the driver packages and the host stack's post-checks on one host",
    "reboot_s": "maintenance: a reboot until the host answers again",
    "module_reload_s": "maintenance: the NVIDIA modules unloaded and loaded again",
    "kv_path_s": "maintenance: the KV-path check after every host",
}


class PlanError(ValueError):
    pass


def check_timing(timing):
    """The timing model with every key, as floats; PlanError naming what is missing or wrong."""
    if not isinstance(timing, dict):
        raise PlanError("pdctl_rollout_timing must be a mapping of %s" % ", ".join(sorted(TIMING_KEYS)))
    problems = ["%s is missing (%s)" % (k, doc) for k, doc in TIMING_KEYS.items() if k not in timing]
    problems += ["%s is not a timing key (known: %s)" % (k, ", ".join(sorted(TIMING_KEYS)))
                 for k in timing if k not in TIMING_KEYS]
    out = {}
    for key in TIMING_KEYS:
        if key in timing:
            try:
                out[key] = float(timing[key])
            except (TypeError, ValueError):
                problems.append("%s must be seconds, not %r" % (key, timing[key]))
                continue
            if out[key] < 0:
                problems.append("%s must not be negative" % key)
    if not problems and out["drain_s"] > out["drain_bound_s"]:
        problems.append("drain_s (%g) is above drain_bound_s (%g)" % (out["drain_s"], out["drain_bound_s"]))
    if problems:
        raise PlanError("pdctl_rollout_timing: " + "; ".join(problems))
    return out


def check_keep(keep):
    """pdctl_rollout_prefill_keep as a float in [0, 1]; PlanError saying what it is otherwise."""
    try:
        share = float(keep)
    except (TypeError, ValueError):
        raise PlanError("pdctl_rollout_prefill_keep must be a share of the prefill instances between 0 and 1 "
                        "(0.5: at least half keep serving; 1: one instance at a time), not %r" % (keep,))
    if not 0 <= share <= 1:
        raise PlanError("pdctl_rollout_prefill_keep must be between 0 and 1 (0.5: at least half keep serving; "
                        "1: one instance at a time), not %g" % share)
    return share


def batch_size(total, keep):
    """How many of `total` prefill instances may be out at once so that at least `keep` of them (a share,
    rounded up) still serve; at least one moves at a time (keep=1: one at a time)."""
    return max(1, total - int(math.ceil(check_keep(keep) * total - 1e-9)))


def batches(items, total, keep):
    """items (the instances that change, in the order they roll) in batches of batch_size(total, keep): each
    batch leaves the routers, restarts and comes back together (roles/upgrade/tasks/batch.yml). The one place a
    batch's size is decided: the playbook loops over these, the plan prints them."""
    size = batch_size(total, keep)
    items = list(items)
    return [items[k:k + size] for k in range(0, len(items), size)]


def _gpus(instances):
    return sum(len(i["gpus"]) for i in instances)


class _Steps:
    """Collects steps; `t` is the timing model, `drains` counts the drain waits of the current step;
    `admission` the front door's full limits ({'inflight', 'queue'}) or None. `routers_in_turn` is what one
    membership change of roles/traffic's routers entry point waits on (maintenance, a temporary decode):
    each router host's router (or standby) restarts in turn; `canaries` one canary through each router."""

    # A move of the front door (roles/traffic: frontdoor_away / frontdoor_home) and the drain of what it left.
    AWAY = HOME = ["frontdoor_s", "drain_s"]

    def __init__(self, plan, timing, admission=None):
        self.t = check_timing(timing)
        self.admission = admission
        routers = max(1, len(plan.get("routers") or ()))
        self.routers_in_turn, self.canaries = ["router_ready_s"] * routers, ["canary_s"] * routers
        self.prefill = sorted((i for i in plan["instances"] if i["pool"] == "prefill"), key=lambda i: i["name"])
        self.decode = [i for i in plan["instances"] if i["pool"] == "decode"]
        self.steps = []

    def add(self, what, parts, prefill, decode_gpus):
        """parts: timing keys waited on in turn (a key may repeat); 'drain_s' also counts at its bound."""
        seconds = sum(self.t[p] for p in parts)
        bound = seconds + parts.count("drain_s") * (self.t["drain_bound_s"] - self.t["drain_s"])
        step = {"step": len(self.steps) + 1, "what": what, "prefill_in_service": prefill,
                "prefill_total": len(self.prefill), "decode_gpus_in_service": decode_gpus,
                "decode_gpus_total": _gpus(self.decode), "seconds": round(seconds, 1),
                "bound_s": round(bound, 1), "drains": parts.count("drain_s")}
        if self.admission is not None:
            try:
                admits = adm.limits(self.admission, step)
            except adm.AdmissionError as exc:
                raise PlanError(str(exc))
            step.update(admission_inflight=admits["inflight"], admission_queue=admits["queue"])
        self.steps.append(step)

    def temporary_decode_in(self):
        """pdctl.vllm_pd.traffic temporary_decode_in: standbys without the lender, the front door to them (a
        drain), the lender stops once idle, the temporary decode starts, the routers pair the other prefill
        instances with it, a canary through each, the front door back to them."""
        return (self.routers_in_turn + self.AWAY + ["engine_stop_s", "engine_ready_s"]
                + self.routers_in_turn + self.canaries + self.HOME)

    def temporary_decode_out(self):
        """traffic temporary_decode_out, the lender's start and the routers' way home: standbys with the
        decode back, the front door to them (a drain), the temporary decode stops, the lender starts (a
        canary); the routers on the plan's membership take the front door back."""
        return (self.routers_in_turn + self.AWAY + ["engine_stop_s", "engine_ready_s", "canary_s"]
                + self.routers_in_turn + self.HOME)


def prefill_steps(plan, timing, pending=None, gated=False, admission=None, keep=1):
    """A change of instances' flags or environment: prefill instances rolled in batches behind the standby
    routers (roles/upgrade/tasks/batch.yml; batches(): as many at once as `keep`, the share that keeps serving,
    allows), then a decode instance behind a temporary decode (roles/upgrade/tasks/decode.yml). pending: the
    instance names that change (default: every prefill one)."""
    s = _Steps(plan, timing, admission)
    n, dgpus = len(s.prefill), _gpus(s.decode)
    todo = [i for i in s.prefill if pending is None or i["name"] in pending]
    decode = [i for i in s.decode if pending is not None and i["name"] in pending]
    unknown = sorted(set(pending or ()) - {i["name"] for i in s.prefill + s.decode})
    if unknown:
        raise PlanError("not instances of the plan: %s" % ", ".join(unknown))
    groups = batches(todo, n, keep)
    s.add("preflight, read the hosts, check every argv, write the units (nothing restarts); %d instance(s) "
          "to roll: %s" % (len(todo) + len(decode), "; ".join(
              [", ".join(i["name"] for i in g) for g in groups] + [i["name"] for i in decode]) or "none"),
          ["run_s"], n, dgpus)
    for group in groups:
        names, out = ", ".join(i["name"] for i in group), len(group)
        s.add("%s out: the standby router without %s takes the front door, the routers' streams finish"
              % (names, "it" if out == 1 else "them"), ["router_ready_s"] + s.AWAY, n - out, dgpus)
        s.add("%s restart%s on the new unit%s (together): a canary on the old one, stop, load, /health, the same "
              "canary" % (names, "s" if out == 1 else "", "" if out == 1 else "s"),
              ["canary_s"] * out + ["engine_stop_s", "engine_ready_s"] + ["canary_s"] * out, n - out, dgpus)
        s.add("%s back: the routers take the front door, the standby drains and leaves" % names,
              s.HOME, n, dgpus)
    for inst in decode:
        lent = lender(plan)
        s.add("%s out: %s leaves the routers, drains and stops; a temporary decode starts on its GPUs; the routers "
              "pair the other prefill instances with it, a canary, the front door back to them"
              % (inst["name"], lent["name"]), s.temporary_decode_in(), n - 1, len(lent["gpus"]))
        s.add("%s restarts on its new unit: a canary on the old one, stop once idle, load, /health, the "
              "same canary" % inst["name"], ["canary_s", "engine_stop_s", "engine_ready_s", "canary_s"],
              n - 1, len(lent["gpus"]))
        s.add("%s back: the standby routers take the front door with it; the temporary decode stops, %s starts "
              "again; the routers on the plan's membership take the front door back" % (inst["name"], lent["name"]),
              s.temporary_decode_out(), n, dgpus)
    if gated and (todo or decode):
        s.add("the gates (SLA, accuracy) through the front door; a failure rolls the same instances back, in the "
              "same batches, to the configuration before the change", ["gates_s"], n, dgpus)
    return s.steps


def lender(plan):
    """The prefill instance whose GPUs carry the temporary decode while a decode instance is out (a decode
    change, the decode host's maintenance turn): the last one by name, so that every run lends the same one
    and a resumed run finds its temporary decode. None without prefill instances."""
    prefill = sorted((i for i in plan["instances"] if i["pool"] == "prefill"), key=lambda i: i["name"])
    return prefill[-1] if prefill else None


def staging(plan):
    """The release switch's staging host and its prefill instances (upgrade.yml's rule: the first
    prefill host, by name, with two prefill instances or more)."""
    by_host = {}
    for inst in sorted(plan["instances"], key=lambda i: i["name"]):
        if inst["pool"] == "prefill":
            by_host.setdefault(inst["host"], []).append(inst)
    for host in sorted(by_host):
        if len(by_host[host]) >= 2:
            return host, by_host[host]
    raise PlanError("a new engine release needs a prefill host with two prefill instances")


def release_steps(plan, timing, gated=True, admission=None):
    """A new engine release: the two-pool switch (roles/upgrade/tasks/release.yml), then the gates."""
    s = _Steps(plan, timing, admission)
    n, dgpus = len(s.prefill), _gpus(s.decode)
    host, (first, lent) = staging(plan)[0], staging(plan)[1][:2]
    staged = [i for i in s.prefill if i["host"] == host]
    s.add("preflight, read the hosts; every host installs the new release's venv beside the old one and "
          "checks every argv (nothing restarts)", ["run_s", "release_stage_s"], n, dgpus)
    s.add("%s leaves the old pool: the standby router without its instances takes the front door, "
          "the routers' streams finish" % host, ["router_ready_s"] + s.AWAY, n - len(staged), dgpus)
    s.add("%s switches: its instances stop; %s starts on the new release and a temporary decode on %s's "
          "GPUs (in parallel)" % (host, first["name"], lent["name"]),
          ["engine_stop_s", "engine_ready_s", "canary_s"], n - len(staged), dgpus)
    s.add("the router restarts with the new pair only, a canary through it; the front door moves to it and "
          "the old pool's streams finish behind the standby", ["router_ready_s", "canary_s"] + s.HOME,
          1, len(lent["gpus"]))
    hosts = []
    for inst in sorted(plan["instances"], key=lambda i: (i["pool"] != "prefill", i["name"])):
        if inst["host"] != host and inst["host"] not in hosts:
            hosts.append(inst["host"])
    for other in hosts:
        mine = [i for i in plan["instances"] if i["host"] == other]
        s.add("%s switches (idle): its instances stop, then start on the new release one at a time, a canary "
              "each (%s)" % (other, ", ".join(sorted(i["name"] for i in mine))),
              ["engine_stop_s"] + ["engine_ready_s", "canary_s"] * len(mine), 1, len(lent["gpus"]))
    s.add("the standby with the whole new pool but the temporary decode takes the front door; the routers' "
          "streams finish", ["router_ready_s"] + s.AWAY, n - 1, dgpus)
    s.add("the temporary decode stops; %s starts on its GPUs, a canary" % lent["name"],
          ["engine_stop_s", "engine_ready_s", "canary_s"], n - 1, dgpus)
    s.add("the router restarts on the plan's membership and takes the front door back; the standby leaves",
          ["router_ready_s"] + s.HOME, n, dgpus)
    if gated:
        s.add("the gates (SLA, accuracy) through the front door; a failure rolls back by the same switch",
              ["gates_s"], n, dgpus)
    return s.steps


def maintenance_steps(plan, timing, hosts=None, reload_hosts=(), admission=None):
    """Host maintenance (playbooks/maintenance.yml): one host at a time, prefill hosts first, the decode
    host last. hosts: the hosts whose turn comes (default: every serving host); reload_hosts: those that
    reload the driver module instead of rebooting (they run the router or the front door)."""
    s = _Steps(plan, timing, admission)
    n, dgpus = len(s.prefill), _gpus(s.decode)
    serving = sorted({i["host"] for i in plan["instances"]})
    turns = [h for h in serving if hosts is None or h in hosts]
    turns.sort(key=lambda h: any(i["host"] == h and i["pool"] == "decode" for i in plan["instances"]))
    s.add("preflight; read every host's loaded driver, packages and instances; %d host(s) to take in turn: %s"
          % (len(turns), ", ".join(turns) or "none"), ["run_s"], n, dgpus)
    for host in turns:
        mine = sorted((i for i in plan["instances"] if i["host"] == host), key=lambda i: i["name"])
        activate = "module_reload_s" if host in reload_hosts else "reboot_s"
        how = "module reload" if host in reload_hosts else "reboot"
        if any(i["pool"] == "decode" for i in mine):
            lent = lender(plan)
            s.add("%s out: %s leaves the routers, drains and stops; a temporary decode starts on its GPUs; the "
                  "routers pair the other prefill instances with it, a canary, the front door back to them"
                  % (host, lent["name"]), s.temporary_decode_in(), n - 1, len(lent["gpus"]))
            s.add("%s: its instances stop once idle; host stack, %s, post-checks"
                  % (host, how), ["engine_stop_s", "host_stack_s", activate], n - 1, len(lent["gpus"]))
            s.add("%s back: its instances start, a canary each; the temporary decode stops and %s starts again; "
                  "the routers on the plan's membership take the front door back" % (host, lent["name"]),
                  ["engine_ready_s", "canary_s"] * len(mine) + s.temporary_decode_out(), n, dgpus)
        else:
            out = len([i for i in mine if i["pool"] == "prefill"])
            s.add("%s out: the standby routers without its instances take the front door, the routers' streams "
                  "finish" % host, s.routers_in_turn + s.AWAY, n - out, dgpus)
            s.add("%s: its instances stop; host stack, %s, post-checks" % (host, how),
                  ["engine_stop_s", "host_stack_s", activate], n - out, dgpus)
            s.add("%s back: its instances start one at a time, a canary each; the routers take the front door back"
                  % host, ["engine_ready_s", "canary_s"] * len(mine) + s.routers_in_turn + s.HOME, n, dgpus)
    if turns:
        s.add("the KV-path check from every prefill instance's GPUs to the decode", ["kv_path_s"], n, dgpus)
    return s.steps


def steps(kind, plan, timing, **kwargs):
    """The steps of one rollout kind (KINDS)."""
    if kind == "prefill":
        return prefill_steps(plan, timing, **kwargs)
    if kind == "release":
        return release_steps(plan, timing, **kwargs)
    if kind == "maintenance":
        return maintenance_steps(plan, timing, **kwargs)
    raise PlanError("unknown rollout kind %r (known: %s)" % (kind, ", ".join(KINDS)))


def summary(step_list):
    """{'seconds', 'bound_s', 'min_prefill_in_service', 'min_decode_gpus_in_service', 'steps'}, and
    'min_admission_inflight' when the steps carry admission limits."""
    out = {"seconds": round(sum(x["seconds"] for x in step_list), 1),
           "bound_s": round(sum(x["bound_s"] for x in step_list), 1),
           "min_prefill_in_service": min((x["prefill_in_service"] for x in step_list), default=None),
           "min_decode_gpus_in_service": min((x["decode_gpus_in_service"] for x in step_list), default=None),
           "steps": len(step_list)}
    if any("admission_inflight" in x for x in step_list):
        out["min_admission_inflight"] = min(x["admission_inflight"] for x in step_list if "admission_inflight" in x)
    return out


def _duration(seconds):
    seconds = int(round(seconds))
    if seconds < 120:
        return "%d s" % seconds
    if seconds < 3600:
        return "%d min %02d s" % divmod(seconds, 60)
    return "%d h %02d min" % (seconds // 3600, seconds % 3600 // 60)


def render(step_list, title):
    """The plan as lines of text: one per step, then the estimate."""
    lines = [title]
    at = 0.0
    for x in step_list:
        at += x["seconds"]
        admits = ""
        if "admission_inflight" in x:
            admits = ", admits %d + queue %d" % (x["admission_inflight"], x["admission_queue"])
        lines.append("%3d. [prefill %d/%d, decode GPUs %d/%d%s] %s  (+%s, at %s)" % (
            x["step"], x["prefill_in_service"], x["prefill_total"], x["decode_gpus_in_service"],
            x["decode_gpus_total"], admits, x["what"], _duration(x["seconds"]), _duration(at)))
    total = summary(step_list)
    lines.append("Estimated duration: %s (%s if every one of the %d drains waits its bound); capacity at least "
                 "%s prefill instance(s) and %s decode GPUs%s"
                 % (_duration(total["seconds"]), _duration(total["bound_s"]), sum(x["drains"] for x in step_list),
                    total["min_prefill_in_service"], total["min_decode_gpus_in_service"],
                    "; the front door admits at least %d in flight" % total["min_admission_inflight"]
                    if "min_admission_inflight" in total else ""))
    return lines
