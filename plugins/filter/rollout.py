"""Jinja filter over the rollout plan (plugins/module_utils/rollout_plan.py): the steps of an upgrade or a
maintenance, the capacity at each, and the estimate from the inventory's timing model.

    preflight_plan | pdctl.vllm_pd.rollout_plan('prefill', pdctl_rollout_timing, pending=[...], gated=true)
    -> {"steps": [...], "summary": {...}, "lines": ["title", "  1. [prefill 4/4, decode GPUs 8/8] ...", ...]}
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import rollout_plan as rp

TITLES = {"prefill": "Rollout plan: a change of prefill instances, one at a time behind the standby routers",
          "release": "Rollout plan: a new engine release, the two-pool switch",
          "maintenance": "Maintenance plan: one host at a time"}


def rollout_plan(plan, kind, timing, pending=None, hosts=None, reload_hosts=(), gated=None):
    """pending: the prefill instances that change (prefill); hosts, reload_hosts: the hosts whose turn comes and
    those that reload the module (maintenance); gated: whether the gates end it (default: as the playbook does)."""
    kwargs = {"prefill": {"pending": pending, "gated": bool(gated)},
              "release": {"gated": True if gated is None else bool(gated)},
              "maintenance": {"hosts": hosts, "reload_hosts": list(reload_hosts or ())}}.get(kind, {})
    try:
        steps = rp.steps(kind, plan, timing, **kwargs)
    except rp.PlanError as exc:
        raise AnsibleFilterError(str(exc)) from exc
    return {"steps": steps, "summary": rp.summary(steps), "lines": rp.render(steps, TITLES[kind])}


class FilterModule:
    def filters(self):
        return {"rollout_plan": rollout_plan}
