# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Jinja filters over host maintenance's decisions (plugins/module_utils/maintenance_decide.py); each returns a
dict, documented in the filter's own YAML file beside this one.

    _maintenance_read.stdout_lines | pdctl.vllm_pd.maintenance_read(driver, turn_file, preflight_plan, inventory_hostname)
    groups | pdctl.vllm_pd.maintenance_order(hostvars, ansible_play_hosts)
    preflight_plan | pdctl.vllm_pd.maintenance_turn(inventory_hostname, maintenance_instances_down, groups, maintenance_hosts)
    preflight_plan | pdctl.vllm_pd.maintenance_rescue(maintenance_instances, maintenance_lender, running_names)
    maintenance_hosts | pdctl.vllm_pd.maintenance_summary(hostvars, driver)
    maintenance_turn | pdctl.vllm_pd.maintenance_carriers(active_names, pdctl_min_prefill_instances)
    maintenance_turn | pdctl.vllm_pd.maintenance_failed(maintenance_failure)
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import maintenance_decide as md
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import rollout_plan as rp


def maintenance_read(lines, driver, turn_file, plan=None, host=None):
    return md.read(list(lines or ()), str(driver), turn_file, plan, host)


def maintenance_order(groups, hostvars, play_hosts):
    return md.order(groups, hostvars, list(play_hosts))


def maintenance_turn(plan, host, instances_down, groups, hosts=()):
    try:
        return md.turn(plan, host, instances_down, groups, hosts)
    except rp.PlanError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def maintenance_rescue(plan, instances, lent, running):
    return md.rescue(plan, instances, lent, list(running or ()))


def maintenance_summary(hosts, hostvars, driver):
    return md.summary(list(hosts or ()), hostvars, str(driver))


def maintenance_carriers(turn, active, minimum=None):
    return md.carriers(turn, list(active or ()), minimum)


def maintenance_failed(turn, failure):
    return md.failed(turn, dict(failure or {}))


class FilterModule:
    def filters(self):
        return {"maintenance_read": maintenance_read, "maintenance_order": maintenance_order,
                "maintenance_turn": maintenance_turn, "maintenance_rescue": maintenance_rescue,
                "maintenance_summary": maintenance_summary, "maintenance_carriers": maintenance_carriers,
                "maintenance_failed": maintenance_failed}
