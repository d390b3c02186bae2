# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The maintenance filters are thin: they hand Ansible's values (tuples, lazy containers) to
plugins/module_utils/maintenance_decide.py as plain lists and turn a plan problem into a filter error.
The decisions themselves are tested in tests/unit/plugins/module_utils/test_maintenance_decide.py."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.pdctl.vllm_pd.plugins.filter import maintenance as filters

DECODE = {"name": "decode-0", "host": "d0", "pool": "decode", "url": "http://d0:8200", "gpus": list(range(8)),
          "unit": "pdctl-vllm-decode-0.service", "api_port": 8200}
GROUPS = {"decode": ["d0"], "serving": ["d0"], "router": [], "frontdoor": []}


def test_a_plan_problem_is_a_filter_error():
    with pytest.raises(AnsibleFilterError, match="no prefill instance"):
        filters.maintenance_turn({"instances": [DECODE]}, "d0", [], GROUPS, ("d0",))


def test_the_filters_take_ansibles_tuples_and_generators():
    hostvars = {"d0": {"maintenance_todo": ["x"], "maintenance_instances_down": [], "maintenance_reboot_required": False}}
    assert filters.maintenance_order(GROUPS, hostvars, ("d0",))["hosts"] == ["d0"]
    assert filters.maintenance_summary(iter(["d0"]), hostvars, "580.95.05")["todo"] == {"d0": ["x"]}
    assert set(filters.FilterModule().filters()) == {"maintenance_read", "maintenance_order", "maintenance_turn",
                                                     "maintenance_rescue", "maintenance_summary", "maintenance_carriers",
                                                     "maintenance_failed"}


def test_the_failure_message_takes_ansibles_mappings():
    turn = {"host": "d0", "instances": [DECODE], "decode_turn": True, "done": [], "left": []}
    assert filters.maintenance_failed(turn, None).startswith("d0 is out of service: ?: failed Its instances (decode-0)")
