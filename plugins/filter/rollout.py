"""Jinja filter over the rollout plan (plugins/module_utils/rollout_plan.py): the steps of an upgrade or a
maintenance, the capacity at each, and the estimate from the inventory's timing model.

    preflight_plan | pdctl.vllm_pd.rollout_plan('prefill', pdctl_rollout_timing, pending=[...], gated=true,
                                                admission=preflight_plan.frontdoor | pdctl.vllm_pd.admission_share(...))
    -> {"steps": [...], "summary": {...},
        "lines": ["title", "  1. [prefill 4/4, decode GPUs 8/8, admits 64 + queue 128] ...", ...]}
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import rollout_plan as rp
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import rollout_state as rs

TITLES = {"prefill": "Rollout plan: a change of instances, one at a time (prefill behind the standby routers, the "
                     "decode behind a temporary decode)",
          "release": "Rollout plan: a new engine release, the two-pool switch",
          "maintenance": "Maintenance plan: one host at a time"}


def rollout_plan(plan, kind, timing, pending=None, hosts=None, reload_hosts=(), gated=None, admission=None):
    """pending: the instances that change (prefill: a decode among them rolls behind a temporary decode); hosts,
    reload_hosts: the hosts whose turn comes and those that reload the module (maintenance); gated: whether the
    gates end it (default: as the playbook does); admission: one front door's full limits (admission_share), to
    print what it admits at each step."""
    kwargs = {"prefill": {"pending": pending, "gated": True if gated is None else bool(gated)},
              "release": {"gated": True if gated is None else bool(gated)},
              "maintenance": {"hosts": hosts, "reload_hosts": list(reload_hosts or ())}}.get(kind, {})
    if admission is not None:
        kwargs = dict(kwargs, admission=admission)
    try:
        steps = rp.steps(kind, plan, timing, **kwargs)
    except rp.PlanError as exc:
        raise AnsibleFilterError(str(exc)) from exc
    return {"steps": steps, "summary": rp.summary(steps), "lines": rp.render(steps, TITLES[kind])}


def rollout_vars(hostvars, host):
    """One host's serving configuration as the inventory has it: {var: value} of rollout_state.ROLLOUT_VARS."""
    return {name: hostvars[host].get(name) for name in rs.ROLLOUT_VARS}


def rollout_config_id(hostvars, hosts):
    """The id of the serving configuration of these hosts (rollout_state.config_id)."""
    return rs.config_id({host: rollout_vars(hostvars, host) for host in hosts})


class FilterModule:
    def filters(self):
        return {"rollout_plan": rollout_plan, "rollout_vars": rollout_vars, "rollout_config_id": rollout_config_id,
                "rollout_current": rs.current, "rollout_decide": rs.decide, "rollout_record": rs.record}
