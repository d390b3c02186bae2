"""Jinja filters over the shared planner and serving code (plugins/module_utils).

Called by their fully qualified names, e.g. `hostvars | pdctl.vllm_pd.plan(groups)`.
"""
from __future__ import annotations

import os

from ansible.errors import AnsibleFilterError

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import (defaults_layer, firewall, hwprofile, serving, topology,
                                                                    varnames)


def plan(hostvars, groups):
    """{'plan': {...}, 'errors': []} for the whole inventory; errors list every problem found."""
    hosts = {}
    for name in groups.get("all", []):
        hv = hostvars[name]
        hosts[name] = {
            "groups": list(hv.get("group_names", [])),
            # Another host's hostvars hold no role defaults: the defaults layer fills in what the inventory leaves out.
            "vars": defaults_layer.layered({k: hv[k] for k in topology.PLAN_VARS if k in hv}, topology.PLAN_VARS),
            # The planner refuses a pdctl_* name nothing reads (the untemplated variables, to see which
            # names the inventory's own templates read).
            "names": varnames.unread_names(hostvars.raw_get(name) if hasattr(hostvars, "raw_get") else hv),
        }
    try:
        return {"plan": topology.build_plan(hosts), "errors": []}
    except topology.PlanError as exc:
        return {"plan": None, "errors": exc.problems}


def quarantine_plan(plan, failures, groups):
    """{'plan': {...}, 'errors': []}: the plan without the prefill hosts that failed their checks
    (topology.quarantine); errors name each failed host and its failure when that is not allowed."""
    try:
        return {"plan": topology.quarantine(plan, failures, groups), "errors": []}
    except topology.QuarantineError as exc:
        return {"plan": None, "errors": exc.problems}


def firewall_rules(plan, hostvars, settings, host=None):
    """{host: [rule, ...]}: the inbound flows each host accepts (firewall.rules); with host, that host's only
    (what its own nftables.conf needs). settings holds the inputs of firewall.rules but the addresses, which
    come from each covered host's variables."""
    inputs = dict(settings or {})
    hosts = firewall.firewall_hosts(plan, inputs.get("monitoring_host"))
    inputs["addresses"] = {h: firewall.host_addresses(hostvars[h] if h in hostvars else {}) for h in hosts}
    try:
        return firewall.rules(plan, inputs, only=None if host is None else [host])
    except firewall.FirewallError as exc:
        raise AnsibleFilterError("firewall rules: %s" % "; ".join(exc.problems)) from exc


def address_in_networks(address, networks):
    """True when address lies in one of the networks (CIDR list)."""
    return firewall.address_in_networks(address, networks)


def kv_nics(profile_overrides):
    """Names of the KV NICs (never NVSwitch management ports) of the expected hardware profile."""
    return hwprofile.kv_nics(hwprofile.resolve(profile_overrides or {}))


def kv_check_paths(plan, base_port, gpus="per_numa"):
    """The prefill GPU -> decode paths the KV-path check proves (topology.kv_check_paths)."""
    return topology.kv_check_paths(plan, base_port, gpus)


def mount_of(mounts, path):
    """The mount (from ansible_facts.mounts) that holds `path`: the longest mount point prefix."""
    best = None
    path = os.path.normpath(str(path))
    for m in mounts or []:
        point = m.get("mount", "")
        if path == point or path.startswith(point.rstrip("/") + "/"):
            if best is None or len(point) > len(best["mount"]):
                best = m
    return best


def repeat_flag(values, flag):
    """[a, b] -> [flag, a, flag, b] (for flags that take one value per occurrence)."""
    return [word for value in values for word in (flag, str(value))]


class FilterModule:
    def filters(self):
        return {
            "plan": plan,
            "quarantine_plan": quarantine_plan,
            "firewall_rules": firewall_rules,
            "address_in_networks": address_in_networks,
            "mount_of": mount_of,
            "kv_nics": kv_nics,
            "kv_check_paths": kv_check_paths,
            "in_venv": serving.in_venv,
            "serve_argv": serving.serve_argv,
            "check_argv": serving.check_argv,
            "serve_environment": serving.serve_environment,
            "systemd_quote": serving.systemd_quote,
            "env_file": serving.env_file,
            "repeat_flag": repeat_flag,
            "stop_timeout_problems": serving.stop_timeout_problems,
        }
