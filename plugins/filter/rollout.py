"""Jinja filters over the rollout plan (plugins/module_utils/rollout_plan.py): the steps of an upgrade or a
maintenance, the capacity at each, and the estimate from the inventory's timing model; and over the rollout
decisions (rollout_state.py, upgrade_decide.py), which playbooks/upgrade.yml and upgrade_pass.yml set their
facts from.

    preflight_plan | pdctl.vllm_pd.rollout_plan('prefill', pdctl_rollout_timing, pending=[...], gated=true,
                                                admission=preflight_plan.frontdoor | pdctl.vllm_pd.admission_share(...))
    -> {"steps": [...], "summary": {...},
        "lines": ["title", "  1. [prefill 4/4, decode GPUs 8/8, admits 64 + queue 128] ...", ...]}

The upgrade's decisions are documented beside this file (upgrade_target.yml, upgrade_rolls.yml,
upgrade_verdict.yml, upgrade_outcome.yml, rollout_lender.yml: `ansible-doc -t filter pdctl.vllm_pd.upgrade_rolls`).
"""
from __future__ import annotations

import base64
import json

from ansible.errors import AnsibleFilterError

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import rollout_plan as rp
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import rollout_state as rs
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import upgrade_decide as ud

TITLES = {"prefill": "Rollout plan: a change of instances (prefill in batches behind the standby routers, the "
                     "decode behind a temporary decode)",
          "release": "Rollout plan: a new engine release, the two-pool switch",
          "maintenance": "Maintenance plan: one host at a time"}


def rollout_plan(plan, kind, timing, pending=None, hosts=None, reload_hosts=(), gated=None, admission=None, keep=1):
    """pending: the instances that change (prefill: a decode among them rolls behind a temporary decode); keep: the
    share of the prefill instances that keeps serving while a batch rolls (pdctl_rollout_prefill_keep); hosts,
    reload_hosts: the hosts whose turn comes and those that reload the module (maintenance); gated: whether the
    gates end it (default: as the playbook does); admission: one front door's full limits (admission_share), to
    print what it admits at each step."""
    kwargs = {"prefill": {"pending": pending, "gated": True if gated is None else bool(gated), "keep": keep},
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


def rollout_lender(plan):
    """The prefill instance whose GPUs carry the temporary decode while a decode instance is out."""
    return rp.lender(plan)


def upgrade_target(journals, configured, rollback=False, retry=False, journal_file=ud.JOURNAL_FILE):
    """The release a run of upgrade.yml aims at, from the serving hosts' release-switch records
    (upgrade_decide.target)."""
    return ud.target([dict(j) for j in journals if isinstance(j, dict)], configured, rollback, retry, journal_file)


def _host_report(hostvars, host):
    """What upgrade_decide.rolls reads of one serving host, as plain data: the vllm role's stage.yml facts and
    the decode turn record upgrade_pass.yml slurped."""
    hv = hostvars[host]
    turn = (hv.get("upgrade_turn_record") or {}).get("content")
    link = ((hv.get("vllm_current_link") or {}).get("stat") or {}).get("lnk_target") or ""
    try:
        record = json.loads(base64.b64decode(turn)) if turn else None
    except ValueError as exc:
        raise AnsibleFilterError("%s: unreadable decode turn record: %s" % (host, exc)) from exc
    return {"pending": list(hv.get("vllm_pending_instances") or ()), "release_changes": bool(hv.get("vllm_release_changes")),
            "stopped": list(hv.get("vllm_stopped_instances") or ()), "turn": record, "current": str(link)}


def upgrade_rolls(plan, hostvars, serving, journal, target_release, rolling_back,
                  journal_file=ud.JOURNAL_FILE, turn_file=ud.TURN_FILE, keep=1):
    """What one pass of upgrade_pass.yml rolls, from what the serving hosts reported (upgrade_decide.rolls)."""
    hosts = {host: _host_report(hostvars, host) for host in serving}
    try:
        return ud.rolls(list(plan["instances"]), list(plan.get("routers") or ()), list(serving), hosts,
                        dict(journal or {}), target_release, bool(rolling_back), journal_file, turn_file, keep)
    except rp.PlanError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def upgrade_run(aim, rollout, rollout_action=None):
    """Where a run of upgrade.yml stands, one object its later plays read (upgrade_decide.standing)."""
    return ud.standing(dict(aim), dict(rollout or {}), rollout_action)


def _run(run):
    run = dict(run)
    return dict(run, journal=dict(run.get("journal") or {}), rollout=dict(run.get("rollout") or {}),
                rolling_back=bool(run.get("rolling_back")), rollout_rollback=bool(run.get("rollout_rollback")),
                rollout_requested=bool(run.get("rollout_requested")))


def upgrade_verdict(kind, run, rollout_gated, rollout_target_now, passed, gates_verdict="", check_mode=False):
    """Whether the release switch, or the prefill change, goes back after the gates' verdict, and where the run
    stands from there (upgrade_decide.verdict_of)."""
    return ud.verdict_of(kind, _run(run), bool(rollout_gated), rollout_target_now, bool(passed), gates_verdict,
                         bool(check_mode))


def upgrade_outcome(kind, run, rollout_gated, rollout_target_now, pending, passed, gates_verdict="", check_mode=False):
    """How a run of upgrade.yml ends: the records' last state, its verdict and last line (upgrade_decide.outcome_of)."""
    return ud.outcome_of(kind, _run(run), bool(rollout_gated), rollout_target_now, list(pending or ()), bool(passed),
                         gates_verdict, bool(check_mode))


class FilterModule:
    def filters(self):
        return {"rollout_plan": rollout_plan, "rollout_vars": rollout_vars, "rollout_config_id": rollout_config_id,
                "rollout_current": rs.current, "rollout_decide": rs.decide, "rollout_record": rs.record,
                "rollout_lender": rollout_lender, "upgrade_target": upgrade_target, "upgrade_run": upgrade_run,
                "upgrade_rolls": upgrade_rolls, "upgrade_verdict": upgrade_verdict, "upgrade_outcome": upgrade_outcome}
