# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""module_utils/rollout_state.py: what a run of upgrade.yml does about a prefill change, from each host's record
of it (/var/lib/pdctl/rollout.json), at every point a run can stop: before the change, while it rolls, while it
rolls back, after either."""
from __future__ import annotations

import pytest

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import rollout_state as rs

OLD = {"pdctl_serve_args": {"prefill": ["--shutdown-timeout", "300"]}}
NEW = {"pdctl_serve_args": {"prefill": ["--shutdown-timeout", "240"]}}
T_OLD, T_NEW = rs.config_id({"h": OLD}), rs.config_id({"h": NEW})
ACCEPTED = {"state": "accepted", "target": T_OLD, "accepted": OLD, "reason": "", "since": "2026-12-04T10:00:00+00:00"}


def act(journal, target=T_NEW, pending=("prefill-2",), release=False, **kw):
    return rs.decide(journal, target, list(pending) if pending is not None else None, release, **kw)


def test_config_id_follows_every_value():
    assert T_OLD != T_NEW and len(T_OLD) == 16
    assert rs.config_id({"a": OLD, "b": NEW}) == rs.config_id({"b": NEW, "a": OLD})


def test_a_change_rolls_then_gates_and_records_what_ran_before():
    assert act(ACCEPTED)["action"] == "roll"
    assert act({})["action"] == "roll"  # never recorded: it rolls (a failed gate then has nothing to go back to)
    rolling = rs.record(ACCEPTED, "rolling", NEW, T_NEW, "t1")
    assert rolling["previous"] == OLD and rolling["state"] == "rolling" and rolling["since"] == "t1"
    assert rs.record({}, "rolling", NEW, T_NEW, "t1")["previous"] is None


def test_nothing_pending_nothing_to_do_and_nothing_written_again():
    assert act(ACCEPTED, target=T_OLD, pending=())["action"] == "none"
    assert rs.record(ACCEPTED, "accepted", OLD, T_OLD, "t9") == ACCEPTED  # same record: its time kept
    first = rs.record({}, "accepted", OLD, T_OLD, "t1")
    assert first == {"state": "accepted", "target": T_OLD, "accepted": OLD, "reason": "", "since": "t1"}


def test_killed_while_rolling_resumes_even_with_nothing_left_pending():
    rolling = rs.record(ACCEPTED, "rolling", NEW, T_NEW, "t1")
    assert act(rolling, pending=())["action"] == "roll"  # the gates are still to run
    # Resumed: the record keeps the configuration from before the change, not the half-rolled one.
    assert rs.record(rolling, "rolling", NEW, T_NEW, "t2")["previous"] == OLD
    refused = act(rolling, target="another")
    assert refused["action"] == "refuse" and T_NEW in refused["message"] and "another" in refused["message"]


def test_killed_while_rolling_back_resumes_the_rollback():
    back = rs.record(rs.record(ACCEPTED, "rolling", NEW, T_NEW, "t1"), "rolling-back", NEW, T_NEW, "t2", "the gates")
    assert act(back, pending=None)["action"] == "rollback"
    assert act(back)["action"] == "rollback"  # whatever the inventory says meanwhile


def test_a_rolled_back_configuration_is_refused_until_retried_or_changed():
    done = rs.record(rs.record(ACCEPTED, "rolling", NEW, T_NEW, "t1"), "rolled-back", NEW, T_NEW, "t3", "SLA: slow")
    assert done["accepted"] == OLD  # what runs again
    refused = act(done)
    assert refused["action"] == "refuse" and "SLA: slow" in refused["message"] and "upgrade_retry" in refused["message"]
    assert act(done, retry=True)["action"] == "roll"
    assert act(done, target="third")["action"] == "roll"
    assert act(done, target=T_OLD, pending=())["action"] == "none"  # the inventory set back: nothing to do


def test_a_release_switch_run_leaves_prefill_changes_alone_but_one_in_progress():
    assert act(ACCEPTED, release=True)["action"] == "none"
    assert act(rs.record(ACCEPTED, "rolling", NEW, T_NEW, "t1"), target="x", release=True)["action"] == "refuse"


def test_pdctl_rollback_prefill_goes_back_to_the_configuration_before_the_last_change():
    done = rs.record(rs.record(ACCEPTED, "rolling", NEW, T_NEW, "t1"), "accepted", NEW, T_NEW, "t2")
    assert done["previous"] == OLD and done["accepted"] == NEW
    assert act(done, pending=None, requested=True)["action"] == "rollback"
    back = rs.record(done, "rolling-back", NEW, T_NEW, "t3", "requested")
    assert back["previous"] == OLD  # a rollback resumed goes to the same place
    assert act(back, pending=None)["action"] == "rollback"


def test_pdctl_rollback_prefill_refusals():
    assert "no prefill change is recorded" in act({}, pending=None, requested=True)["message"]
    rolling = rs.record(ACCEPTED, "rolling", NEW, T_NEW, "t1")
    assert "not finished" in act(rolling, pending=None, requested=True)["message"]
    assert "rolled back already" in act(dict(rolling, state="rolled-back"), pending=None, requested=True)["message"]
    nothing_before = rs.record(rs.record({}, "rolling", NEW, T_NEW, "t1"), "accepted", NEW, T_NEW, "t2")
    refused = act(nothing_before, pending=None, requested=True)
    assert refused["action"] == "refuse" and "no configuration before" in refused["message"]


def test_the_record_furthest_on_wins():
    a = {"state": "accepted", "since": "2026-12-04T10:00:00+00:00"}
    b = {"state": "rolling", "since": "2026-12-04T09:00:00+00:00"}
    c = {"state": "rolling-back", "since": "2026-12-04T08:00:00+00:00"}
    assert rs.current([a, b, c]) is c and rs.current([a, b]) is b
    assert rs.current([a, dict(a, since="2026-12-04T11:00:00+00:00")])["since"].startswith("2026-12-04T11")
    assert rs.current([None, {}]) == {}


def test_pdctl_rollback_prefill_asks_the_upgrade_playbook_for_it(tmp_path, monkeypatch):
    from inventories import inventory_variant
    from test_run import result

    from pdctl import cli, runner
    seen = {}

    def fake_run(playbook, inventory, **kw):
        seen.update(playbook=playbook, extra=kw["extra_args"])
        return result(0)

    monkeypatch.setattr(runner, "run_playbook", fake_run)
    inv = inventory_variant(tmp_path / "inv", {})
    assert cli.main(["rollback", "--prefill", "-i", str(inv), "--artifacts", str(tmp_path / "a")]) == 0
    assert seen["playbook"] == "playbooks/upgrade.yml" and seen["extra"][:2] == ["-e", "upgrade_rollback=prefill"]
