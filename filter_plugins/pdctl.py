"""Jinja filters over the shared planner (module_utils/pdctl_topology.py)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils"))
import pdctl_hwprofile  # noqa: E402
import pdctl_serving  # noqa: E402
import pdctl_topology  # noqa: E402  (module_utils is not a package the controller can import otherwise)


def pdctl_plan(hostvars, groups):
    """{'plan': {...}, 'errors': []} for the whole inventory; errors list every problem found."""
    hosts = {}
    for name in groups.get("all", []):
        hv = hostvars[name]
        hosts[name] = {
            "groups": [g for g in hv.get("group_names", [])],
            "vars": {k: hv[k] for k in pdctl_topology.PLAN_VARS if k in hv},
        }
    try:
        return {"plan": pdctl_topology.build_plan(hosts), "errors": []}
    except pdctl_topology.PlanError as exc:
        return {"plan": None, "errors": exc.problems}


def pdctl_kv_nics(profile_overrides):
    """Names of the KV NICs (never NVSwitch management ports) of the expected hardware profile."""
    return pdctl_hwprofile.kv_nics(pdctl_hwprofile.resolve(profile_overrides or {}))


def pdctl_mount_of(mounts, path):
    """The mount (from ansible_facts.mounts) that holds `path`: the longest mount point prefix."""
    best = None
    path = os.path.normpath(str(path))
    for m in mounts or []:
        point = m.get("mount", "")
        if path == point or path.startswith(point.rstrip("/") + "/"):
            if best is None or len(point) > len(best["mount"]):
                best = m
    return best


def pdctl_repeat_flag(values, flag):
    """[a, b] -> [flag, a, flag, b] (for flags that take one value per occurrence)."""
    return [word for value in values for word in (flag, str(value))]


class FilterModule:
    def filters(self):
        return {
            "pdctl_plan": pdctl_plan,
            "pdctl_mount_of": pdctl_mount_of,
            "pdctl_kv_nics": pdctl_kv_nics,
            "pdctl_in_venv": pdctl_serving.in_venv,
            "pdctl_serve_argv": pdctl_serving.serve_argv,
            "pdctl_check_argv": pdctl_serving.check_argv,
            "pdctl_serve_environment": pdctl_serving.serve_environment,
            "pdctl_systemd_quote": pdctl_serving.systemd_quote,
            "pdctl_env_file": pdctl_serving.env_file,
            "pdctl_repeat_flag": pdctl_repeat_flag,
        }
