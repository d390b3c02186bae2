# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a run of playbooks/upgrade.yml does, decided from what the hosts report (issue 36).

Two decisions, each a pure function of plain data that returns a dict the playbooks set their facts from:

- target(): which release the run aims at, from the release-switch records of the serving hosts
  (/var/lib/pdctl/release-switch.json: {"from", "to", "state": switching | rolling-back | accepted |
  rolled-back, "reason", "since"}) and what was asked (the manifest's release, `pdctl rollback`); a request
  that cannot be met is refused before anything changes.
- rolls(): what one pass of playbooks/upgrade_pass.yml rolls, once the hosts staged the target and said
  which instances run another configuration: a compatible change (prefill instances in batches, a decode
  one behind a temporary decode) or the two-pool switch of a release, and where a killed run resumes it.

A run may be killed anywhere and run again: each decision reads only what the hosts say now (their links,
their instances, their records), never what the killed run meant to do.
"""
from __future__ import annotations

import os
import re

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import rollout_plan as rp

JOURNAL_FILE = "/var/lib/pdctl/release-switch.json"
TURN_FILE = "/var/lib/pdctl/maintenance-turn.json"
# The words `-e upgrade_rollback=...` accepts for a release rollback (`prefill` asks for a prefill one).
YES = ("true", "yes", "on", "1")
REQUESTED = "requested (pdctl rollback)"
# A switch recorded in one of these states is not finished: a run resumes it, whatever the links say.
UNFINISHED = ("switching", "rolling-back")


def switch_journal(journals):
    """The release-switch record to act on among the serving hosts' ({} when none). The hosts' records agree
    unless a run was killed while writing them: then the step furthest on is the one to resume, a rollback
    over a switch, a switch over a finished one, else the latest."""
    found = [j for j in journals if isinstance(j, dict)]
    for state in ("rolling-back", "switching"):
        for journal in found:
            if journal.get("state") == state:
                return journal
    latest = sorted(found, key=lambda j: str(j.get("since", "")).lower(), reverse=True)
    return latest[0] if latest else {}


def target(journals, configured, rollback=False, retry=False, journal_file=JOURNAL_FILE):
    """The release this run aims at. journals: the serving hosts' release-switch records; configured: the
    manifest's release; rollback: `-e upgrade_rollback` as given (true: `pdctl rollback`; prefill: `pdctl
    rollback --prefill`, rollout_state.py's); retry: `-e upgrade_retry`, to try a rolled-back release again.

    Returns {"journal", "state", "requested", "requested_prefill", "rolling_back", "reason", "target_release",
    "record_rollback": a requested rollback to record before anything changes, "problem": None or why the
    run is refused}."""
    journal = switch_journal(journals)
    state = journal.get("state", "none")
    since, to = journal.get("from", ""), journal.get("to", "")
    requested = str(rollback).lower() in YES
    rolling_back = state == "rolling-back" or requested
    if state == "rolling-back":
        reason = journal.get("reason", "")
    else:
        reason = REQUESTED if requested else ""
    out = {"journal": journal, "state": state, "requested": requested, "requested_prefill": str(rollback) == "prefill",
           "rolling_back": rolling_back, "reason": reason, "target_release": since if rolling_back else configured,
           "record_rollback": requested and state != "rolling-back", "problem": None}
    if requested and state == "switching":
        out["problem"] = ("the switch from %s to %s is not finished: run the upgrade again to finish it (it rolls back "
                          "by itself if the gates fail), then `pdctl rollback`; nothing was touched." % (since, to))
    elif requested and state not in ("accepted", "rolling-back"):
        out["problem"] = "nothing to roll back: %s records %s." % (
            journal_file, "no release switch" if state == "none" else "the switch to %s as %s" % (to, state))
    elif not requested and state == "switching" and to != configured:
        out["problem"] = ("a switch from %s to %s is in progress (%s): run the upgrade with %s to finish it, or "
                          "`pdctl rollback` to return to %s; nothing was touched." % (since, to, journal_file, to, since))
    elif not requested and state == "rolled-back" and to == configured and not retry:
        out["problem"] = ("%s was rolled back (%s); the hosts run %s. Set another release, or pass -e upgrade_retry=true "
                          "to try %s again; nothing was touched." % (to, journal.get("reason", ""), since, to))
    return out


def _names(instances):
    return [i["name"] for i in instances]


def _staging(instances):
    """The release switch's staging host and its prefill instances by name ('' and [] when there is none)."""
    try:
        return rp.staging({"instances": instances})
    except rp.PlanError:
        return "", []


def rolls(instances, routers, serving, hosts, journal, target_release, rolling_back,
          journal_file=JOURNAL_FILE, turn_file=TURN_FILE, keep=1):
    """What one pass of playbooks/upgrade_pass.yml rolls, and whether it may.

    instances, routers: the plan's; serving: the serving hosts, in the inventory's order; hosts: {host:
    {"pending": names of its instances that run another configuration (or are stopped), "release_changes":
    its `current` link names another release, "stopped": names of its instances not running at all, "turn":
    the decode turn record an interrupted run left there or None, "current": where its `current` link points}};
    journal, target_release, rolling_back: target()'s; keep: the share of the prefill instances that keeps serving
    while a batch rolls (pdctl_rollout_prefill_keep, rollout_plan.batches).

    Returns {"kind": release | compatible, "switch_resumed", "pending": the instances that run another
    configuration (a resumed decode change's lender aside: that change brings it back itself), "release_hosts",
    "turns", "staging_host", "staging", "staging_switched", "old_hosts", "switch_from", "decode_roll",
    "decode_resumed", "lender", "prefill_roll", "prefill_batches": prefill_roll in the batches that roll together,
    "rolled": the names this pass rolls, "host_instances", "host_pending":
    {serving host: its planned instances, those of them that run another configuration}, "switch_to": the vllm
    role's vllm_switch_to, "problem": None or why this playbook must not roll it, "summary": what it rolls, in a
    line, "rolled_summary": what it rolled, the line the pass ends with}."""
    changing = {name for host in serving for name in hosts[host].get("pending") or ()}
    pending = [i for i in instances if i["name"] in changing]
    release_hosts = [h for h in serving if hosts[h].get("release_changes")]
    stopped_hosts = [h for h in serving if hosts[h].get("stopped")]
    turns = [hosts[h]["turn"] for h in serving if hosts[h].get("turn") is not None]
    # A decode change's turn says "by": "upgrade"; a maintenance turn has none (maintenance.yml finishes it).
    upgrade_turns = [t for t in turns if "by" in t]
    maintenance_turns = [t for t in turns if "by" not in t]
    prefill = [i for i in instances if i["pool"] == "prefill"]
    switch_resumed = journal.get("state", "none") in UNFINISHED
    kind = "release" if release_hosts or switch_resumed else "compatible"

    # The two-pool switch: the staging host's first prefill instance and a temporary decode on its second's
    # GPUs are the new release's first pair; it switched already when its link names the target (resumed).
    staging_host, staging = _staging(instances)
    # The other hosts still to switch: on the old release, or with an instance a killed run left stopped;
    # prefill hosts first, the decode's last. (An instance merely still loading is not one: the switch went
    # past it.)
    old_hosts = []
    for inst in sorted(instances, key=lambda i: i["pool"].lower(), reverse=True):
        host = inst["host"]
        if host != staging_host and host not in old_hosts and (host in release_hosts or host in stopped_hosts):
            old_hosts.append(host)
    current = (hosts.get(staging_host) or {}).get("current") or ""

    # A decode instance changes behind a temporary decode on the lender's GPUs: those pending, and one whose
    # change an interrupted run left (its host holds the turn record).
    lent = rp.lender({"instances": instances})
    decode_roll = []
    if kind == "compatible":
        pending_names, turn_hosts = set(_names(pending)), [t.get("host") for t in upgrade_turns]
        decode_roll = [i for i in instances if i["pool"] == "decode"
                       and (i["name"] in pending_names or i["host"] in turn_hosts)]
    decode_resumed = bool(upgrade_turns)
    if decode_resumed and lent is not None:
        # Stopped (or starting) with the temporary decode on its GPUs and port: the decode change brings it back
        # (the traffic role's temporary_decode_out); the prefill roll would start it beside the temporary decode.
        pending = [i for i in pending if i["name"] != lent["name"]]

    out = {"kind": kind, "switch_resumed": switch_resumed, "pending": pending, "release_hosts": release_hosts,
           "turns": turns, "staging_host": staging_host, "staging": staging,
           "staging_switched": staging_host not in release_hosts, "old_hosts": old_hosts,
           "switch_from": re.sub("^vllm-", "", os.path.basename(current)),
           "decode_roll": decode_roll, "decode_resumed": decode_resumed, "lender": lent,
           "prefill_roll": sorted((i for i in pending if i["pool"] == "prefill"), key=lambda i: i["name"])
           if kind == "compatible" else [],
           "rolled": _unique(_names(pending + decode_roll)),
           # Per serving host, for the two-pool switch's steps: its planned instances, and those of them that run
           # another configuration (or are stopped) - the ones that drain and stop before its `current` link moves.
           "host_instances": {h: [i for i in instances if i["host"] == h] for h in serving},
           "host_pending": {h: [i for i in instances if i["host"] == h and i["name"] in (hosts[h].get("pending") or ())]
                            for h in serving},
           # The release the vllm role switches to by name: the one before the switch when rolling back, else its
           # own (the manifest's).
           "switch_to": target_release if rolling_back else ""}
    out["prefill_batches"] = rp.batches(out["prefill_roll"], len(prefill), keep)
    out["problem"] = _problem(out, prefill, routers, serving, maintenance_turns, journal_file, turn_file)
    out["summary"] = _summary(out, target_release, rolling_back)
    out["rolled_summary"] = _rolled_summary(out, target_release)
    return out


def _unique(names):
    return [n for k, n in enumerate(names) if n not in names[:k]]


def _problem(out, prefill, routers, serving, maintenance_turns, journal_file, turn_file):
    """Why this playbook must not roll what out says (None: it may); nothing was touched yet."""
    if not out["switch_resumed"] and len(out["release_hosts"]) not in (0, len(serving)):
        return ("the engine release differs on %s only, and no switch is recorded (%s): the hosts were changed outside "
                "this playbook; run site.yml; no instance was touched." % (", ".join(out["release_hosts"]), journal_file))
    if out["kind"] == "release" and not (len(out["staging"]) >= 2 and len(prefill) > len(out["staging"])):
        return ("a new engine release needs a prefill host with two prefill instances and prefill instances on "
                "another host (the two-pool switch, docs/upgrades.md); no instance was touched.")
    if maintenance_turns:
        return ("the maintenance turn of %s was interrupted (%s): finish it first with `pdctl maintain`; no instance "
                "was touched." % (", ".join(t.get("host", "") for t in maintenance_turns), turn_file))
    if out["decode_roll"] and len(prefill) < 2:
        return ("decode instance(s) %s would change: a temporary decode serves while one restarts, on the GPUs of a "
                "prefill instance, and at least one other must serve meanwhile (two prefill instances or more); no "
                "instance was touched." % ", ".join(_names(out["decode_roll"])))
    without = [r["host"] for r in routers if not r.get("standby_port")]
    if without:
        return ("router(s) %s have no standby: set pdctl_ports.router_standby and router_standby_metrics (then "
                "site.yml, which plans them); no instance was touched." % ", ".join(without))
    return None


def _summary(out, target_release, rolling_back):
    """What the pass rolls, as the playbook prints it."""
    if out["kind"] == "release":
        first, second = (_names(out["staging"]) + ["", ""])[:2]
        return ("%s: the two-pool switch to %s%s, its first pair on %s (%s and a temporary decode on %s's GPUs)%s; hosts "
                "to switch after it: %s" % ("rolling back" if rolling_back else "a new engine release", target_release,
                                            " (resumed)" if out["switch_resumed"] else "", out["staging_host"], first,
                                            second, " (switched already)" if out["staging_switched"] else "",
                                            ", ".join(out["old_hosts"]) or "none"))
    line = "%d instance(s) to roll: %s" % (len(out["pending"]), ", ".join(_names(out["pending"])) or "none, nothing to do")
    if out["prefill_batches"]:
        line += "; prefill in batches %s" % ", ".join("[%s]" % ", ".join(_names(b)) for b in out["prefill_batches"])
    if out["decode_roll"]:
        line += "; the decode behind a temporary decode on %s's GPUs%s" % (
            out["lender"]["name"], " (resumed)" if out["decode_resumed"] else "")
    return line


def _rolled_summary(out, target_release):
    """What the pass rolled, as the playbook prints it once the instances are back."""
    if out["kind"] == "release":
        return "every instance runs %s; no request was paired across releases" % target_release
    line = ("%d instance(s) rolled (%s), in batches: the standby routed to every other instance while a batch was out"
            % (len(out["rolled"]), ", ".join(out["rolled"]) or "none"))
    if out["decode_roll"]:
        line += ", a temporary decode served while the decode restarted"
    return line


def standing(aim, rollout, rollout_action):
    """Where a run of playbooks/upgrade.yml stands, as the one object its later plays read (upgrade_run) and
    verdict_of() moves on. aim: target()'s; rollout: the prefill change's record to act on (rollout_state.current());
    rollout_action: rollout_state.decide()'s action for it at the run's start (rollback: `pdctl rollback --prefill`,
    or a rollback resumed).

    Returns {"journal", "rolling_back", "reason", "target_release": the release switch's (target()'s),
    "rollout": the prefill change's record, "rollout_rollback": this run rolls the prefill change back,
    "rollout_requested": `pdctl rollback --prefill` asked for it}."""
    return {"journal": dict(aim["journal"]), "rolling_back": bool(aim["rolling_back"]), "reason": aim["reason"],
            "target_release": aim["target_release"], "rollout": dict(rollout or {}),
            "rollout_rollback": rollout_action == "rollback", "rollout_requested": bool(aim["requested_prefill"])}


def verdict_of(kind, run, rollout_gated, rollout_target_now, passed, gates_verdict, check_mode):
    """verdict() on a run's standing (standing()): its result, with "run", the standing from here."""
    out = verdict(kind, run["rolling_back"], run["journal"], run["reason"], run["target_release"], rollout_gated,
                  run["rollout_rollback"], run["rollout"], rollout_target_now, passed, gates_verdict, check_mode)
    moved = ("rolling_back", "reason", "target_release", "rollout_rollback", "rollout")
    out["run"] = dict(run, **{key: out[key] for key in moved})
    return out


def outcome_of(kind, run, rollout_gated, rollout_target_now, pending, passed, gates_verdict, check_mode):
    """outcome() on a run's standing after its last verdict (verdict_of()'s "run")."""
    return outcome(kind, run["rolling_back"], run["journal"], run["reason"], run["target_release"], rollout_gated,
                   run["rollout_rollback"], run["rollout"], rollout_target_now, run["rollout_requested"], pending,
                   passed, gates_verdict, check_mode)


def verdict(kind, rolling_back, journal, reason, target_release, rollout_gated, rollout_rollback, rollout,
            rollout_target_now, passed, gates_verdict, check_mode):
    """What the gates' verdict on one pass means: a new release, or a prefill change, that failed them goes back
    (a second pass of upgrade_pass.yml), unless this pass rolled back already or ran in check mode (the gates
    were not measured).

    kind: rolls()'s; rolling_back, journal, reason, target_release: where the run stands (target(), the release
    switch's record); rollout_gated, rollout_rollback, rollout, rollout_target_now: the prefill change's
    (rollout_state.py); passed, gates_verdict: the gates' (true and '' when they did not run).

    Returns {"rollback_now": the release switch goes back, "rolling_back", "reason", "target_release": the run's
    from here, "rollout_rollback_now": the prefill change goes back, "rollout_rollback", "rollout": the prefill
    change's record from here, "rollout_reason": why it goes back ('' when it does not)}."""
    failed = not passed and not check_mode
    rollback_now = kind == "release" and not rolling_back and failed
    rollout_rollback_now = bool(rollout_gated) and not rollout_rollback and failed
    out = {"rollback_now": rollback_now, "rolling_back": rolling_back, "reason": reason,
           "target_release": target_release, "rollout_rollback_now": rollout_rollback_now,
           "rollout_rollback": rollout_rollback, "rollout": rollout, "rollout_reason": ""}
    if rollback_now:
        out.update(rolling_back=True, reason="the gates failed on %s: %s" % (journal.get("to"), gates_verdict),
                   target_release=journal.get("from"))
    if rollout_rollback_now:
        out["rollout_reason"] = "the gates failed: %s" % gates_verdict
        out.update(rollout_rollback=True, rollout=dict(rollout, target=rollout_target_now, state="rolling-back",
                                                       reason=out["rollout_reason"]))
    return out


def outcome(kind, rolling_back, journal, reason, target_release, rollout_gated, rollout_rollback, rollout,
            rollout_target_now, rollout_requested, pending, passed, gates_verdict, check_mode):
    """How the run ends, once the gates judged its last pass: what each record says from now on, whether the run
    succeeded, the line it ends with, and what it reports to its caller (set_stats).

    The arguments are verdict()'s after it (rollout_requested: `pdctl rollback --prefill`; pending: the
    instances the pass rolled). A rollback the gates asked for ends the run failed, whatever the gates said
    after it; a requested one fails only if the gates reject the release (or configuration) it went back to.

    Returns {"journal_state": the release switch's record to write (None: left as it is), "rollout_state",
    "rollout_target", "rollout_reason": the prefill change's (rollout_state None: left as it is), "ok", "msg",
    "report": {"verdict": accepted | rolled-back | rejected | check, "rolled_back", "reason", "passed",
    "kind", "target_release"}}."""
    journal_state = None
    if journal.get("state", "none") in UNFINISHED and (rolling_back or passed) and not check_mode:
        journal_state = "rolled-back" if rolling_back else "accepted"
    rollout_state = None
    if not check_mode and passed and not rolling_back:
        rollout_state = "rolled-back" if rollout_rollback else "accepted"
    ok = (not rolling_back or (reason == REQUESTED and passed)) and (
        not rollout_rollback or (bool(rollout_requested) and passed))
    out = {"journal_state": journal_state, "rollout_state": rollout_state,
           "rollout_target": rollout.get("target") if rollout_rollback else rollout_target_now,
           "rollout_reason": rollout.get("reason", "") if rollout_rollback else "", "ok": ok}
    # The lines as the playbook printed them (benchmarks/upgrade.py reads them), spaces included.
    if ok:
        out["msg"] = _done(kind, rolling_back, target_release, rollout_gated, rollout_rollback, rollout, pending,
                           gates_verdict, check_mode)
    else:
        out["msg"] = _rolled_back(rolling_back, reason, target_release, rollout_rollback, rollout, rollout_requested,
                                  passed, gates_verdict)
    rolled_back = bool(rolling_back or rollout_rollback)
    # The run fails exactly when rejected (its verdict task asserts ok), in check mode too: a rollback the gates
    # asked for, resumed in check mode, is still theirs.
    if not ok:
        word = "rejected"
    elif check_mode:
        word = "check"
    else:
        word = "rolled-back" if rolled_back else "accepted"
    out["report"] = {"verdict": word, "rolled_back": rolled_back and not check_mode, "passed": bool(passed),
                     "reason": (rollout.get("reason", "") if rollout_rollback and not rolling_back else reason) or "",
                     "kind": kind, "target_release": target_release}
    return out


def _done(kind, rolling_back, target_release, rollout_gated, rollout_rollback, rollout, pending, gates_verdict,
          check_mode):
    if check_mode:
        return ("Check mode: nothing changed; the steps above are what a run would take %s (the gates were not "
                "measured). " % (("back to %s" % target_release) if rolling_back else ""))
    if rolling_back:
        return ("Rolled back on request: every instance runs %s again, the gates passed (%s)."
                % (target_release, gates_verdict))
    if rollout_rollback:
        return ("Rolled back on request: the prefill instances run their configuration before %s again, the gates "
                "passed (%s)." % (rollout.get("target"), gates_verdict))
    if kind == "release":
        return "Every instance runs %s; the gates passed (%s). " % (target_release, gates_verdict)
    return "%d instance(s) rolled in batches%s." % (
        len(pending), ("; the gates passed (%s)" % gates_verdict) if rollout_gated else "")


def _rolled_back(rolling_back, reason, target_release, rollout_rollback, rollout, rollout_requested, passed,
                 gates_verdict):
    after = "passed" if passed else "FAILED too: %s" % gates_verdict
    if rollout_rollback and not rolling_back:
        if rollout_requested:
            return ("Rolled back on request from the prefill configuration %s, but the gates failed again: %s "
                    % (rollout.get("target"), gates_verdict))
        return ("Upgrade rolled back: %s (prefill configuration %s). Every prefill instance runs its configuration "
                "before the change again; the gates after the rollback %s. "
                % (rollout.get("reason"), rollout.get("target"), after))
    if reason == REQUESTED:
        return "Rolled back on request to %s, but the gates failed again: %s " % (target_release, gates_verdict)
    return ("Upgrade rolled back: %s. Every instance runs %s again; the gates after the rollback %s. "
            % (reason, target_release, after))
