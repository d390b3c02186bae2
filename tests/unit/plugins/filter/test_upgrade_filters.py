# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""plugins/filter/rollout.py's upgrade decisions: what they read of hostvars (the slurped records and the vllm role's
stage facts), and their documentation beside the plugin (what `ansible-doc -t filter` shows) against their
signatures."""
from __future__ import annotations

import base64
import inspect
import json
import os

import pytest
from ansible.errors import AnsibleFilterError
import yaml

from ansible_collections.pdctl.vllm_pd.plugins.filter import rollout as rf

FILTERS = os.path.join(os.path.dirname(rf.__file__))
PLAN = {"instances": [{"name": "decode-0", "host": "d0", "pool": "decode"},
                      {"name": "prefill-0", "host": "p0", "pool": "prefill"},
                      {"name": "prefill-1", "host": "p0", "pool": "prefill"},
                      {"name": "prefill-2", "host": "p1", "pool": "prefill"},
                      {"name": "prefill-3", "host": "p1", "pool": "prefill"}],
        "routers": [{"host": "d0", "standby_port": 8001}]}


def slurped(record):
    return {"content": base64.b64encode(json.dumps(record).encode()).decode(), "changed": False}


def stage(pending=(), release=False, turn=None):
    facts = {"vllm_pending_instances": list(pending), "vllm_release_changes": release, "vllm_stopped_instances": [],
             "vllm_current_link": {"stat": {"exists": True, "lnk_target": "/opt/pdctl/venvs/vllm-0.33.0"}},
             "upgrade_turn_record": slurped(turn) if turn else {"changed": False, "skipped": True}}
    return facts


def test_upgrade_rolls_reads_each_serving_hosts_facts_and_turn_record():
    hostvars = {"d0": stage(pending=["decode-0"], turn={"host": "d0", "lender": "prefill-3", "by": "upgrade"}),
                "p0": stage(), "p1": stage(pending=["prefill-3"]), "frontdoor-0": {}}
    got = rf.upgrade_rolls(PLAN, hostvars, ["d0", "p0", "p1"], {}, "0.33.0", False)
    assert got["problem"] is None and got["decode_resumed"] and got["turns"] == [
        {"host": "d0", "lender": "prefill-3", "by": "upgrade"}]
    assert [i["name"] for i in got["pending"]] == ["decode-0"] and got["lender"]["name"] == "prefill-3"


def test_upgrade_rolls_names_a_host_whose_turn_record_is_unreadable():
    hostvars = {"d0": dict(stage(), upgrade_turn_record={"content": base64.b64encode(b"{not json").decode()}),
                "p0": stage(), "p1": stage()}
    with pytest.raises(AnsibleFilterError, match="d0: unreadable decode turn record"):
        rf.upgrade_rolls(PLAN, hostvars, ["d0", "p0", "p1"], {}, "0.33.0", False)


def test_the_switch_starts_from_the_release_the_staging_host_runs():
    hostvars = {h: stage(release=True) for h in ("d0", "p0", "p1")}
    got = rf.upgrade_rolls(PLAN, hostvars, ["d0", "p0", "p1"], {}, "0.34.0", False)
    assert got["kind"] == "release" and got["staging_host"] == "p0" and got["switch_from"] == "0.33.0"


def test_upgrade_target_skips_what_is_not_a_record():
    got = rf.upgrade_target(iter([{"state": "switching", "from": "a", "to": "b", "since": "x"}, "junk"]), "b")
    assert got["problem"] is None and got["journal"]["state"] == "switching"


def test_rollout_lender_is_the_last_prefill_instance_by_name():
    assert rf.rollout_lender(PLAN)["name"] == "prefill-3"
    assert rf.rollout_lender({"instances": PLAN["instances"][:1]}) is None


@pytest.mark.parametrize("name", ["upgrade_target", "upgrade_run", "upgrade_rolls", "upgrade_verdict", "upgrade_outcome",
                                  "rollout_lender"])
def test_each_documented_filter_matches_its_signature(name):
    with open(os.path.join(FILTERS, name + ".yml")) as fh:
        doc = yaml.safe_load(fh)
    assert set(doc) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}
    assert doc["DOCUMENTATION"]["name"] == name and "pdctl.vllm_pd.%s" % name in doc["EXAMPLES"]
    func = rf.FilterModule().filters()[name]
    params = list(inspect.signature(func).parameters)
    options = doc["DOCUMENTATION"]["options"]
    assert ["_input"] + params[1:] == list(options)
    assert [p.strip() for p in doc["DOCUMENTATION"]["positional"].split(",")] == ["_input"] + params[1:]
    for param in params[1:]:
        default = inspect.signature(func).parameters[param].default
        if default is inspect.Parameter.empty:
            assert options[param].get("required"), param
        else:
            assert options[param].get("default") == default, param


def test_the_runs_standing_goes_through_the_verdict_and_the_outcome_as_plain_data():
    aim = rf.upgrade_target([{"state": "switching", "from": "a", "to": "b", "since": "x"}], "b")
    run = rf.upgrade_run(aim, {}, None)
    failed = rf.upgrade_verdict("release", run, False, "cfg", False, "SLA: failed")
    assert failed["rollback_now"] and failed["run"]["rolling_back"] and failed["run"]["target_release"] == "a"
    ended = rf.upgrade_outcome("release", failed["run"], False, "cfg", [], True, "SLA: passed")
    assert not ended["ok"] and ended["report"]["verdict"] == "rejected"
