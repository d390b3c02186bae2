# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What an upgrade changes, and the ordered steps that roll it out, as pure data (issue 15).

Input: two states of the same deployment, what runs (deployed) and what should (target):

    {"instances": [{"name": "prefill-0", "host": "h1", "pool": "prefill", "release": "0.33.0",
                    "argv": [...], "environment": {...}}, ...],
     "router": {"host": "h1", "version": "0.1.17", "argv": [...]}}

plan(deployed, target) classifies the difference:

- ``none``: nothing differs; no steps.
- ``compatible``: flags, environment or the router change; every instance keeps its release, so any
  prefill still pairs with any decode. One instance at a time (prefill instances first, then decode),
  each taken out of the router, drained, restarted, checked and put back: never more than one
  prefill instance out of rotation (at least N-1 of N serve). The one decode instance has no twin:
  one prefill instance's GPUs carry a temporary decode while it restarts. A router change runs a
  second router, moves the front door to it, restarts the first and moves back.
- ``release``: the engine release changes. Prefill and decode of different releases refuse each
  other's KV (NIXL compatibility hash), so no request may pair across releases: the two-pool
  switch. One prefill host leaves the old pool and runs a complete new-release pair (its first
  prefill instance on the new release, a temporary decode on its second instance's GPUs) behind a
  second router; it is gated, the front door switches to it, the old pool drains, the remaining
  instances move over one at a time, the temporary decode gives its GPUs back, and the first router
  (restarted on the target) takes the front door back.

Every step is a dict with the same keys, so a playbook can loop over them and --check can print them:
``action``, ``host``, ``instance`` (None for a host or router step), ``router`` (``primary``, ``second``
or None), ``release`` (for stage/start steps, else None), ``workers`` (the instances a router starts
with, else None) and ``why``. Actions: stage_release, router_remove, wait_drained, stop, start,
restart, wait_ready, canary, router_add, start_temporary_decode, stop_temporary_decode, start_router,
restart_router, stop_router, switch_frontdoor, gate.

rollback_plan(current, previous) is the same plan back to a recorded previous state.
"""
from __future__ import annotations

POOLS = ("prefill", "decode")
TEMP_DECODE = "decode-temporary"


class UpgradeError(ValueError):
    pass


# ---------------------------------------------------------------- validation

def _check_str(value, where, problems):
    if not isinstance(value, str) or not value:
        problems.append("%s must be a non-empty string, got %r" % (where, value))
        return False
    return True


def _check_argv(value, where, problems):
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        problems.append("%s must be a non-empty list of strings, got %r" % (where, value))


def _validate(state, label):
    """Return the state's instances by name; raise UpgradeError naming every problem."""
    problems = []
    if not isinstance(state, dict):
        raise UpgradeError("%s state must be a dict with instances and router, got %s" % (label, type(state).__name__))
    unknown = sorted(set(state) - {"instances", "router"})
    if unknown:
        problems.append("%s state: unknown keys %s (expected instances, router)" % (label, ", ".join(unknown)))
    instances = state.get("instances")
    by_name = {}
    if not isinstance(instances, list) or not instances:
        problems.append("%s state: instances must be a non-empty list" % label)
        instances = []
    for i, inst in enumerate(instances):
        where = "%s instances[%d]" % (label, i)
        if not isinstance(inst, dict):
            problems.append("%s must be a dict, got %r" % (where, inst))
            continue
        if _check_str(inst.get("name"), where + ".name", problems):
            where = "%s instance %s" % (label, inst["name"])
            if inst["name"] in by_name:
                problems.append("%s: name given twice" % where)
            by_name[inst["name"]] = inst
        missing = sorted({"name", "host", "pool", "release", "argv", "environment"} - set(inst))
        if missing:
            problems.append("%s: missing %s" % (where, ", ".join(missing)))
            continue
        _check_str(inst["host"], where + ".host", problems)
        _check_str(inst["release"], where + ".release", problems)
        if inst["pool"] not in POOLS:
            problems.append("%s.pool must be one of %s, got %r" % (where, ", ".join(POOLS), inst["pool"]))
        _check_argv(inst["argv"], where + ".argv", problems)
        env = inst["environment"]
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            problems.append("%s.environment must be a dict of strings, got %r" % (where, env))
    pools = {inst.get("pool") for inst in by_name.values()}
    for pool in POOLS:
        if by_name and pool not in pools:
            problems.append("%s state has no %s instance" % (label, pool))
    router = state.get("router")
    if not isinstance(router, dict):
        problems.append("%s state: router must be a dict with host, version, argv, got %r" % (label, router))
    else:
        _check_str(router.get("host"), "%s router.host" % label, problems)
        _check_str(router.get("version"), "%s router.version" % label, problems)
        _check_argv(router.get("argv"), "%s router.argv" % label, problems)
    if problems:
        raise UpgradeError("; ".join(problems))
    releases = sorted({inst["release"] for inst in by_name.values()})
    if len(releases) > 1:
        raise UpgradeError("%s state mixes engine releases %s: prefill and decode must run one release "
                           "(a release switch that stopped half-way is resumed from its recorded plan)"
                           % (label, ", ".join(releases)))
    return by_name


def _order(instances):
    """Prefill before decode; then by host and name (a stable, readable order)."""
    return sorted(instances, key=lambda i: (POOLS.index(i["pool"]), i["host"], i["name"]))


# ---------------------------------------------------------------- steps

def _step(action, why, host=None, instance=None, router=None, release=None, workers=None):
    return {"action": action, "host": host, "instance": instance, "router": router, "release": release,
            "workers": list(workers) if workers is not None else None, "why": why}


def _take_out(inst, router, reason):
    return [_step("router_remove", "take %s out of the %s router's rotation: %s" % (inst["name"], router, reason),
                  inst["host"], inst["name"], router),
            _step("wait_drained", "wait until %s has no request in flight and no KV waiting to be pulled"
                  % inst["name"], inst["host"], inst["name"], router)]


def _put_back(inst, router):
    return [_step("wait_ready", "%s answers /health and /v1/models" % inst["name"], inst["host"], inst["name"]),
            _step("canary", "one request straight to %s before it takes traffic" % inst["name"],
                  inst["host"], inst["name"]),
            _step("router_add", "%s back into the %s router's rotation" % (inst["name"], router),
                  inst["host"], inst["name"], router)]


def _changed(old, new):
    return [k for k in ("release", "argv", "environment") if old[k] != new[k]]


def _compatible_steps(target, router_host, changes, router_changes):
    steps = []
    prefill = _order(i for i in target.values() if i["pool"] == "prefill")
    for inst in _order(target[n] for n in changes):
        if inst["pool"] != "prefill":
            continue
        steps += _take_out(inst, "primary", "its %s change" % "/".join(changes[inst["name"]]))
        steps.append(_step("restart", "start %s with its target %s" % (inst["name"], "/".join(changes[inst["name"]])),
                           inst["host"], inst["name"], release=inst["release"]))
        steps += _put_back(inst, "primary")
    for inst in _order(target[n] for n in changes):
        if inst["pool"] != "decode":
            continue
        if len(prefill) < 2:
            raise UpgradeError("decode instance %s cannot restart without a temporary decode, which needs one of "
                               "two or more prefill instances to lend its GPUs; there is %d" % (inst["name"], len(prefill)))
        lender = prefill[-1]
        steps += _take_out(lender, "primary", "its GPUs carry a temporary decode while %s restarts" % inst["name"])
        steps.append(_step("stop", "free %s's GPUs" % lender["name"], lender["host"], lender["name"]))
        steps.append(_step("start_temporary_decode", "a decode of release %s on %s's GPUs, so requests keep a "
                           "decode while %s restarts" % (inst["release"], lender["name"], inst["name"]),
                           lender["host"], TEMP_DECODE, release=inst["release"]))
        steps.append(_step("wait_ready", "the temporary decode answers /health and /v1/models", lender["host"], TEMP_DECODE))
        steps.append(_step("router_add", "the temporary decode into the primary router's rotation",
                           lender["host"], TEMP_DECODE, "primary"))
        steps += _take_out(inst, "primary", "its %s change" % "/".join(changes[inst["name"]]))
        steps.append(_step("restart", "start %s with its target %s" % (inst["name"], "/".join(changes[inst["name"]])),
                           inst["host"], inst["name"], release=inst["release"]))
        steps += _put_back(inst, "primary")
        steps += _take_out({"name": TEMP_DECODE, "host": lender["host"]}, "primary", "%s is back" % inst["name"])
        steps.append(_step("stop_temporary_decode", "give the GPUs back to %s" % lender["name"], lender["host"], TEMP_DECODE))
        steps.append(_step("start", "%s on its GPUs again, with its target flags" % lender["name"],
                           lender["host"], lender["name"], release=lender["release"]))
        steps += _put_back(lender, "primary")
    if router_changes:
        steps += _router_swap(target, router_host, router_changes)
    return steps


def _router_swap(target, host, router_changes):
    """Second router, front door to it, first router restarted on the target, front door back."""
    workers = [i["name"] for i in _order(target.values())]
    what = "/".join(router_changes)
    return [
        _step("start_router", "a second router on the target %s with every instance, so the first can restart "
              "without losing a request" % what, host, router="second", workers=workers),
        _step("wait_ready", "the second router answers /readiness", host, router="second"),
        _step("switch_frontdoor", "new requests to the second router", host, router="second"),
        _step("wait_drained", "the first router has no request in flight", host, router="primary"),
        _step("restart_router", "the first router on its target %s" % what, host, router="primary", workers=workers),
        _step("wait_ready", "the first router answers /readiness", host, router="primary"),
        _step("switch_frontdoor", "new requests back to the first router", host, router="primary"),
        _step("wait_drained", "the second router has no request in flight", host, router="second"),
        _step("stop_router", "the second router is no longer needed", host, router="second"),
    ]


def _release_steps(target, router_host, old_release, new_release):
    prefill = [i for i in target.values() if i["pool"] == "prefill"]
    hosts = sorted({i["host"] for i in target.values()} | {router_host})
    per_host = {}
    for inst in prefill:
        per_host.setdefault(inst["host"], []).append(inst)
    staging = sorted(per_host, key=lambda h: (-len(per_host[h]), h))[0]
    mine = sorted(per_host[staging], key=lambda i: i["name"])
    if len(mine) < 2:
        raise UpgradeError("the release switch needs a prefill host with two instances (one becomes the new "
                           "release's prefill, the other's GPUs carry its temporary decode); the most any has is 1")
    if len(prefill) == len(mine):
        raise UpgradeError("the release switch takes prefill host %s out of the old pool, which would leave it no "
                           "prefill instance: it needs prefill instances on a second host" % staging)
    new_prefill, lender = mine[0], mine[1]
    rest = _order(i for i in target.values() if i["host"] != staging or i["pool"] != "prefill")
    steps = [_step("stage_release", "install release %s beside %s and check every instance's argv with its "
                   "parser; nothing restarts" % (new_release, old_release), h, release=new_release) for h in hosts]
    for inst in mine:
        steps += _take_out(inst, "primary", "host %s leaves the old pool to run the new release's pair" % staging)
    for inst in mine:
        steps.append(_step("stop", "free %s's GPUs for the new release" % inst["name"], staging, inst["name"]))
    steps.append(_step("start", "%s on release %s" % (new_prefill["name"], new_release), staging,
                       new_prefill["name"], release=new_release))
    steps.append(_step("wait_ready", "%s answers /health and /v1/models" % new_prefill["name"], staging,
                       new_prefill["name"]))
    steps.append(_step("start_temporary_decode", "a decode of release %s on %s's GPUs: the new release's pool is "
                       "complete without a spare GPU" % (new_release, lender["name"]), staging, TEMP_DECODE,
                       release=new_release))
    steps.append(_step("wait_ready", "the temporary decode answers /health and /v1/models", staging, TEMP_DECODE))
    steps.append(_step("start_router", "a second router pairing only release %s instances" % new_release,
                       router_host, router="second", workers=[new_prefill["name"], TEMP_DECODE]))
    steps.append(_step("wait_ready", "the second router answers /readiness", router_host, router="second"))
    steps.append(_step("gate", "canary, SLA and accuracy gates through the second router before it takes traffic",
                       router_host, router="second", release=new_release))
    steps.append(_step("switch_frontdoor", "new requests to release %s; requests in flight finish on %s"
                       % (new_release, old_release), router_host, router="second"))
    steps.append(_step("wait_drained", "the old pool's requests in flight are done", router_host, router="primary"))
    for inst in rest:
        steps.append(_step("router_remove", "%s leaves the idle first router" % inst["name"], inst["host"],
                           inst["name"], "primary"))
        steps.append(_step("stop", "%s off release %s" % (inst["name"], old_release), inst["host"], inst["name"]))
        steps.append(_step("start", "%s on release %s" % (inst["name"], new_release), inst["host"], inst["name"],
                           release=new_release))
        steps += _put_back(inst, "second")
    steps += _take_out({"name": TEMP_DECODE, "host": staging}, "second", "the real decode serves release %s"
                       % new_release)
    steps.append(_step("stop_temporary_decode", "give the GPUs back to %s" % lender["name"], staging, TEMP_DECODE))
    steps.append(_step("start", "%s on release %s" % (lender["name"], new_release), staging, lender["name"],
                       release=new_release))
    steps += _put_back(lender, "second")
    workers = [i["name"] for i in _order(target.values())]
    steps += [
        _step("restart_router", "the first router on its target, every instance on release %s" % new_release,
              router_host, router="primary", workers=workers),
        _step("wait_ready", "the first router answers /readiness", router_host, router="primary"),
        _step("switch_frontdoor", "new requests back to the first router", router_host, router="primary"),
        _step("wait_drained", "the second router has no request in flight", router_host, router="second"),
        _step("stop_router", "the second router is no longer needed", router_host, router="second"),
        _step("gate", "SLA and accuracy gates on release %s through the front door" % new_release, router_host,
              router="primary", release=new_release),
    ]
    return steps


# ---------------------------------------------------------------- capacity (read from the steps)

def prefill_in_service(steps, deployed):
    """Replay the steps: the fewest prefill instances in the rotation of the router the front door
    sends to, at any point. Raises UpgradeError if a step stops or restarts an instance that a router
    still sends to."""
    pool = {i["name"]: i["pool"] for i in deployed["instances"]}
    members = {"primary": set(pool), "second": set()}
    active = "primary"
    running = set(pool)

    def count():
        return sum(1 for n in members[active] if pool.get(n) == "prefill" and n in running)

    low = count()
    for n, s in enumerate(steps):
        act, inst = s["action"], s["instance"]
        if act == "router_remove":
            members[s["router"]].discard(inst)
        elif act == "router_add":
            members[s["router"]].add(inst)
        elif act in ("start_router", "restart_router"):
            members[s["router"]] = set(s["workers"])
        elif act == "switch_frontdoor":
            active = s["router"]
        elif act in ("stop", "restart", "stop_temporary_decode"):
            inside = [r for r in members if inst in members[r]]
            if inside:
                raise UpgradeError("step %d (%s %s) while the %s router still sends to it" % (n, act, inst, inside[0]))
            if act != "restart":
                running.discard(inst)
        elif act in ("start", "start_temporary_decode"):
            running.add(inst)
        low = min(low, count())
    return low


# ---------------------------------------------------------------- the plans

def plan(deployed, target):
    """Classify deployed -> target and return {kind, from_release, to_release, changes, steps,
    prefill_total, min_prefill_in_service}. Raises UpgradeError on input it cannot plan."""
    old, new = _validate(deployed, "deployed"), _validate(target, "target")
    problems = []
    for name in sorted(set(old) - set(new)):
        problems.append("instance %s is deployed but not in the target (a topology change is a redeploy, not "
                        "an upgrade)" % name)
    for name in sorted(set(new) - set(old)):
        problems.append("instance %s is in the target but not deployed (a topology change is a redeploy, not "
                        "an upgrade)" % name)
    for name in sorted(set(old) & set(new)):
        for key in ("host", "pool"):
            if old[name][key] != new[name][key]:
                problems.append("instance %s moves %s %s -> %s (a topology change is a redeploy, not an upgrade)"
                                % (name, key, old[name][key], new[name][key]))
    if problems:
        raise UpgradeError("; ".join(problems))
    from_release = next(iter(old.values()))["release"]
    to_release = next(iter(new.values()))["release"]
    changes = {n: _changed(old[n], new[n]) for n in sorted(new) if _changed(old[n], new[n])}
    router_changes = [k for k in ("version", "argv") if deployed["router"][k] != target["router"][k]]
    if deployed["router"]["host"] != target["router"]["host"]:
        raise UpgradeError("the router moves host %s -> %s (a topology change is a redeploy, not an upgrade)"
                           % (deployed["router"]["host"], target["router"]["host"]))
    router_host = target["router"]["host"]
    if from_release != to_release:
        kind = "release"
        steps = _release_steps(new, router_host, from_release, to_release)
    elif changes or router_changes:
        kind = "compatible"
        steps = _compatible_steps(new, router_host, changes, router_changes)
    else:
        kind, steps = "none", []
    prefill_total = sum(1 for i in new.values() if i["pool"] == "prefill")
    low = prefill_in_service(steps, deployed)
    if kind == "compatible" and low < prefill_total - 1:
        raise UpgradeError("internal: the compatible plan leaves %d of %d prefill instances in service" % (low, prefill_total))
    return {"kind": kind, "from_release": from_release, "to_release": to_release,
            "changes": {"instances": changes, "router": router_changes}, "steps": steps,
            "prefill_total": prefill_total, "min_prefill_in_service": low}


def rollback_plan(current, previous):
    """The plan that returns `current` to the recorded `previous` state; every step's why says so."""
    result = plan(current, previous)
    for step in result["steps"]:
        step["why"] = "rollback: " + step["why"]
    result["rollback"] = True
    return result
