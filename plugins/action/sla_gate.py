# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pdctl.vllm_pd.sla_gate: the SLA gate, run by the controller itself (plugins/modules/sla_gate.py documents it).

An action plugin, not a module: the gate's code (plugin_utils) needs the controller's libraries and never
goes to a host, so no interpreter override and no delegation.
"""
from __future__ import annotations

from ansible.module_utils.common.parameters import remove_values
from ansible.plugins.action import ActionBase

from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import report, sla

# The options of plugins/modules/sla_gate.py's DOCUMENTATION (tests/unit/test_module_docs.py holds them equal).
ARGUMENT_SPEC = dict(
    router_url=dict(type="str", required=True),
    api_key=dict(type="str", no_log=True),
    ca_file=dict(type="path"),
    # No defaults here: an option left unset keeps what `config` says (else sla.DEFAULTS).
    client=dict(type="list", elements="str"),
    exec_prefix=dict(type="list", elements="str"),
    contexts=dict(type="list", elements="int"),
    output_len=dict(type="int"),
    concurrency=dict(type="int"),
    num_prompts=dict(type="int"),
    max_ttft_ms=dict(type="float"),
    max_tpot_ms=dict(type="float"),
    tokenizer=dict(type="str", no_log=False),   # a tokenizer name or path, not a secret
    model=dict(type="str"),
    capacity=dict(type="dict"),
    config=dict(type="dict", default={}),
    artifacts_dir=dict(type="path", required=True),
)
# The options that override the same key of `config`.
CONFIG_OPTIONS = ("client", "exec_prefix", "contexts", "output_len", "concurrency", "num_prompts", "max_ttft_ms",
                  "max_tpot_ms", "tokenizer", "model", "capacity")
RUN_KEYS = ("input_len", "concurrency", "num_prompts", "completed", "failed", "mean_ttft_ms", "p99_ttft_ms",
            "mean_tpot_ms", "p99_tpot_ms", "sem_ttft_ms", "sem_tpot_ms", "output_throughput", "passed")


def settings(p: dict) -> dict:
    """The gate's settings: `config`, the options given over it, the key and CA in the client's environment."""
    cfg = dict(p["config"])
    cfg.update({key: p[key] for key in CONFIG_OPTIONS if p[key] is not None})
    if p["api_key"]:
        cfg["env"] = dict(cfg.get("env") or {}, OPENAI_API_KEY=p["api_key"])  # the client's bearer token
    if p["ca_file"]:
        # Trusted by the client's TLS (OpenSSL in vllm-rs, aiohttp in vllm bench); a path where the client runs.
        cfg["env"] = dict(cfg.get("env") or {}, SSL_CERT_FILE=p["ca_file"])
    return cfg


def measure(p: dict, check_mode: bool) -> dict:
    """The task's result for validated options `p` (failed=True when the gate failed or could not run)."""
    cfg = settings(p)
    problems = sla.validate(sla.merge_config(cfg))
    if problems:
        return dict(failed=True, msg="sla_gate: invalid input: %s" % "; ".join(problems), passed=False,
                    failures=problems)
    if check_mode:
        return dict(passed=True, failures=[], validated=True)
    try:
        result = sla.run(p["router_url"], cfg, p["artifacts_dir"])
    except sla.SlaError as exc:
        return dict(failed=True, msg="sla_gate: %s" % exc, passed=False, failures=[str(exc)])
    files = report.write_sla(p["artifacts_dir"], result)
    out = dict(passed=result["passed"], failures=result["failures"], files=files, wall_s=result["wall_s"],
               runs=[{k: r.get(k) for k in RUN_KEYS} for r in result["runs"]])
    if result.get("capacity"):
        out["capacity"] = {k: v for k, v in result["capacity"].items() if k != "probes"}
    if not result["passed"]:
        out.update(failed=True, msg="SLA gate failed: %s (report %s)" % ("; ".join(result["failures"]),
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
        return remove_values(result, {p[k] for k in ("api_key",) if p[k]})
