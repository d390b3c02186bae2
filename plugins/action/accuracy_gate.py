# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pdctl.vllm_pd.accuracy_gate: the accuracy gate, run by the controller itself (plugins/modules/accuracy_gate.py
documents it).

An action plugin, not a module: the gate's code (plugin_utils) needs the controller's libraries and never
goes to a host, so no interpreter override and no delegation.
"""
from __future__ import annotations

import os

from ansible.module_utils.common.parameters import remove_values
from ansible.plugins.action import ActionBase

from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import accuracy, datasets, report

BENCHMARKS = ["aime", "gpqa", "longbench"]
# The options of plugins/modules/accuracy_gate.py's DOCUMENTATION (tests/unit/test_module_docs.py holds them equal).
ARGUMENT_SPEC = dict(
    router_url=dict(type="str", required=True),
    api_key=dict(type="str", no_log=True),
    ca_file=dict(type="path"),
    model=dict(type="str"),
    # No defaults here: an option left unset keeps what `config` says (else accuracy.DEFAULTS).
    benchmarks=dict(type="list", elements="str", choices=BENCHMARKS),
    datasets=dict(type="dict"),
    local_dir=dict(type="path"),
    cache_dir=dict(type="path"),
    hf_token=dict(type="str", no_log=True),
    reference=dict(type="path"),
    config=dict(type="dict", default={}),
    artifacts_dir=dict(type="path", required=True),
)
SECRETS = ("api_key", "hf_token")


def default_cache_dir() -> str:
    """Where Hub downloads go when neither the task nor `config` names a place: pdctl's cache on the
    controller (the rule of pdctl.cache, which this collection does not import; a unit test ties the two)."""
    root = os.environ.get("PDCTL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "pdctl")
    return os.path.join(root, "datasets")


def settings(p: dict) -> dict:
    """The gate's settings: `config`, with the options given over it."""
    cfg = dict(p["config"])
    if p["api_key"]:
        cfg["api_key"] = p["api_key"]
    if p["ca_file"]:
        cfg["ca_file"] = p["ca_file"]
    cfg.update({key: p[key] for key in ("benchmarks", "datasets", "local_dir", "cache_dir") if p[key] is not None})
    if not cfg.get("local_dir") and not cfg.get("cache_dir"):
        cfg["cache_dir"] = default_cache_dir()
    return cfg


def measure(p: dict, check_mode: bool) -> dict:
    """The task's result for validated options `p` (failed=True when the gate failed or could not run)."""
    cfg = settings(p)
    problems = accuracy.validate(accuracy.merge_config(cfg))
    reference = None
    if p["reference"]:
        try:
            reference = accuracy.load_reference(p["reference"])
        except (OSError, ValueError, KeyError) as exc:
            problems.append("reference %s unreadable: %s" % (p["reference"], exc))
    if problems:
        return dict(failed=True, msg="accuracy_gate: invalid input: %s" % "; ".join(problems), passed=False,
                    failures=problems)
    if check_mode:
        return dict(passed=True, failures=[], validated=True)
    try:
        result, rows = accuracy.run(p["router_url"], cfg, model=p["model"], token=p["hf_token"], reference=reference)
    except datasets.DatasetError as exc:
        return dict(failed=True, msg="accuracy_gate: data set: %s" % exc, passed=False, failures=[str(exc)])
    except Exception as exc:  # the router did not answer at all (connection refused, HTTP error on /v1/models)
        return dict(failed=True, msg="accuracy_gate: %s at %s: %s" % (type(exc).__name__, p["router_url"], exc),
                    passed=False, failures=[str(exc)])
    files = report.write_accuracy(p["artifacts_dir"], result, rows)
    out = dict(passed=result["passed"], benchmarks=result["benchmarks"], failures=result["failures"], files=files,
               wall_s=result["wall_s"])
    if not result["passed"]:
        out.update(failed=True, msg="accuracy gate failed: %s (report %s)" % ("; ".join(result["failures"]),
                                                                              files["markdown"]))
    return out


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    # Nothing runs on the task's host: no connection to it is opened.
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # no effect on an action that runs nothing remotely
        _validated, p = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        result.update(measure(p, bool(self._task.check_mode)), changed=False)
        # As a module's fail_json/exit_json would: the secrets never appear in what the task returns.
        return remove_values(result, {p[k] for k in SECRETS if p[k]})
