# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a run of playbooks/upgrade.yml does about a change of the prefill instances' configuration (flags,
environment, engine files, unit settings: a compatible change), from the record every serving host keeps of
it (/var/lib/pdctl/rollout.json) - issue 41: such a change ends with the gates and rolls back by itself when
they fail, as a release does.

The record, per serving host: {"state": accepted | rolling | rolling-back | rolled-back, "target": the id of
the configuration rolled to (ROLLOUT_VARS of every serving host), "accepted": this host's ROLLOUT_VARS as last
accepted, "previous": this host's ROLLOUT_VARS before the change in progress (or the last one), "reason",
"since"}. A rollback sets the hosts' ROLLOUT_VARS to "previous" for the run (set_fact outranks the inventory)
and rolls the same way as the change did.
"""
from __future__ import annotations

import hashlib
import json

# The inventory variables the vllm role reads to build an instance's unit and environment (not the release,
# the model or the key: a release has its own switch).
ROLLOUT_VARS = ("pdctl_serve_args", "pdctl_serve_environment", "pdctl_ucx_environment", "pdctl_engine",
                "pdctl_serve_stop_timeout_s")
# When records disagree (a run killed while writing them), the one furthest on is resumed.
_ORDER = {"rolling-back": 0, "rolling": 1}


def config_id(per_host):
    """{host: {var: value}} -> a short id of the whole serving configuration."""
    return hashlib.sha256(json.dumps(per_host, sort_keys=True, default=str).encode()).hexdigest()[:16]


def current(journals):
    """The record to act on among the serving hosts' ({} when none)."""
    found = [j for j in journals if isinstance(j, dict) and j.get("state")]
    if not found:
        return {}
    return sorted(found, key=lambda j: (_ORDER.get(j["state"], 2), _neg(j.get("since", ""))))[0]


def _neg(text):
    return [-ord(c) for c in text]


def decide(journal, target, pending, release_kind, requested=False, retry=False):
    """What this run does about a compatible change.

    journal: current(records); target: config_id of the inventory's configuration; pending: the prefill
    instances whose running configuration differs from the inventory's (None before the hosts were read);
    release_kind: the run switches an engine release; requested: `pdctl rollback --prefill`. Returns
    {"action": none | roll | rollback | refuse, "message": str}."""
    state = journal.get("state", "none")
    out = {"action": "none", "message": ""}
    if requested:
        refusal = {"none": "nothing to roll back: no prefill change is recorded (/var/lib/pdctl/rollout.json)",
                   "rolling": "the prefill change to %s is not finished: run the upgrade again to finish it (it rolls "
                              "back by itself if the gates fail), then `pdctl rollback --prefill`" % journal.get("target"),
                   "rolled-back": "nothing to roll back: the last prefill change (to %s) was rolled back already (%s)"
                                  % (journal.get("target"), journal.get("reason", ""))}.get(state)
        if refusal:
            out.update(action="refuse", message=refusal + "; nothing was touched.")
            return out
    if requested or state == "rolling-back":
        if not journal.get("previous"):
            out.update(action="refuse", message=(
                "no configuration before the prefill change to %s is recorded: set the inventory back and run the "
                "upgrade; nothing was touched." % journal.get("target")))
            return out
        out.update(action="rollback", message="the prefill instances go back to their configuration before the "
                   "change to %s%s" % (journal.get("target"), "" if requested else " (resumed)"))
        return out
    if state == "rolling" and journal.get("target") != target:
        out.update(action="refuse", message=(
            "a prefill change to %s is in progress (/var/lib/pdctl/rollout.json) and the inventory now says %s: run "
            "the upgrade with the inventory of that change to finish it, or `pdctl rollback --prefill`; nothing was "
            "touched."
            % (journal.get("target"), target)))
        return out
    if release_kind or pending is None:
        return out
    if state == "rolled-back" and journal.get("target") == target and pending and not retry:
        out.update(action="refuse", message=(
            "this prefill configuration (%s) was rolled back (%s); the instances run the one before it. Change the "
            "inventory, or pass -e upgrade_retry=true to try it again; nothing was touched."
            % (target, journal.get("reason", ""))))
        return out
    if pending or state == "rolling":
        out.update(action="roll", message="%d prefill instance(s) to roll, then the gates%s" % (
            len(pending), " (resumed)" if state == "rolling" else ""))
    return out


def record(journal, state, vars_now, target, now, reason=""):
    """This host's next record: `state` for the change to `target`; vars_now: the host's ROLLOUT_VARS as the
    inventory has them. A record that would not change keeps its time (a run with nothing to do writes nothing)."""
    new = dict(journal)
    if state == "rolling" and journal.get("state") != "rolling":
        new["previous"] = journal.get("accepted")  # None when nothing was recorded before: no rollback then
    if state == "accepted":
        new["accepted"] = vars_now
    new.update(state=state, target=target, reason=reason)
    if {k: v for k, v in new.items() if k != "since"} != {k: v for k, v in journal.items() if k != "since"}:
        new["since"] = now
    return new
