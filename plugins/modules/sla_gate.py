#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sla_gate
short_description: Latency SLA gate through the router with the real vllm bench serve client
description:
  - Runs C(vllm bench serve) (or the standalone C(vllm-rs bench serve)) through the router at each context
    length, random data at exact lengths (C(--random-range-ratio 0 --ignore-eos)), reads its saved JSON, and
    fails naming the context length and the measured value when mean TTFT or mean TPOT is over its limit
    or any request failed.
  - Optionally searches the SLA capacity, the highest concurrency at which both limits still hold (doubling,
    then bisection, up to a maximum); use it as the router's admission limit.
  - Thin wrapper over C(pdctl.gates.sla); it must run on the controller with the pdctl virtualenv's python
    (C(delegate_to=localhost), C(run_once=true), C(ansible_python_interpreter="{{ ansible_playbook_python }}")).
    The client itself may run on a serving host through O(exec_prefix) (for example C(ssh decode-0)).
version_added: "0.1.0"
options:
  client:
    description: The benchmark command, as a list (default C(config.client), else C([vllm, bench, serve])).
    type: list
    elements: str
  exec_prefix:
    description: Runs the client (and reads its result) through this command, for example C([ssh, decode-0]).
    type: list
    elements: str
  contexts:
    description: Input lengths in tokens (default C(config.contexts), else 16384, 65536, 131072, 262144).
    type: list
    elements: int
  output_len:
    description: Output tokens per request (default C(config.output_len), else 1024).
    type: int
  concurrency:
    description: Maximum concurrency of the per-context runs (default C(config.concurrency), else 8).
    type: int
  num_prompts:
    description: Requests per run; default max(64, 4 x concurrency).
    type: int
  max_ttft_ms:
    description: Limit on mean TTFT (default C(config.max_ttft_ms), else 2500).
    type: float
  max_tpot_ms:
    description: Limit on mean TPOT (default C(config.max_tpot_ms), else 20).
    type: float
  tokenizer:
    description: Tokenizer path or name given to the client (default the served model name).
    type: str
  model:
    description: Served model name (default the client asks the server).
    type: str
  capacity:
    description: Capacity search, C(enabled), C(start), C(max), C(contexts) (default the longest context).
    type: dict
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - pdctl.vllm_pd.attributes
  - pdctl.vllm_pd.gate_client
  - pdctl.vllm_pd.gate_settings
"""

EXAMPLES = r"""
- name: SLA gate at 16K-256K, client on the decode host
  pdctl.vllm_pd.sla_gate:
    router_url: "{{ pdctl_plan.frontdoor.url }}"
    exec_prefix: [ssh, -o, BatchMode=yes, "{{ groups['decode'][0] }}"]
    client: ["{{ pdctl_paths.venvs }}/current/bin/vllm", bench, serve]
    capacity: {enabled: true, max: 128}
    artifacts_dir: "{{ playbook_dir }}/../artifacts/gates/{{ ansible_date_time.iso8601_basic_short }}"
  delegate_to: localhost
  run_once: true
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
"""

RETURN = r"""
passed:
  description: Whether every context length met both limits with no failed request.
  type: bool
  returned: always
  sample: true
runs:
  description: Per context length; input_len, concurrency, completed, failed, mean/p99 TTFT and TPOT (ms), passed.
  type: list
  elements: dict
  returned: unless check mode
  sample: [{"input_len": 16384, "mean_ttft_ms": 812.0, "mean_tpot_ms": 17.1, "failed": 0, "passed": true}]
capacity:
  description: SLA capacity search result (max_concurrency, per_context, router_max_concurrent_requests).
  type: dict
  returned: when capacity.enabled
  sample: {"max_concurrency": 24, "router_max_concurrent_requests": 24}
failures:
  description: One line per failure, naming the context length and the measured value.
  type: list
  elements: str
  returned: always
  sample: ["context 131072: mean TPOT 23.41 ms > limit 20.00 ms (concurrency 8)"]
files:
  description: Report files written.
  type: dict
  returned: unless check mode
  sample: {"json": "artifacts/gates/20261129T120000Z/sla.json"}
wall_s:
  description: Wall time of the gate in seconds.
  type: float
  returned: unless check mode
  sample: 640.2
"""

from ansible.module_utils.basic import AnsibleModule

RUN_KEYS = ("input_len", "concurrency", "num_prompts", "completed", "failed", "mean_ttft_ms", "p99_ttft_ms",
            "mean_tpot_ms", "p99_tpot_ms", "sem_ttft_ms", "sem_tpot_ms", "output_throughput", "passed")


def build_module():
    return AnsibleModule(
        argument_spec=dict(
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
        ),
        supports_check_mode=True,
    )


def main():
    module = build_module()
    p = module.params
    try:
        from pdctl.gates import report, sla
    except ImportError as exc:
        module.fail_json(msg="sla_gate needs the pdctl package (%s): run it on the controller with "
                             "ansible_python_interpreter set to the pdctl virtualenv's python" % exc)
    cfg = dict(p["config"])
    for key in ("client", "exec_prefix", "contexts", "output_len", "concurrency", "num_prompts", "max_ttft_ms",
                "max_tpot_ms", "tokenizer", "model", "capacity"):
        if p[key] is not None:
            cfg[key] = p[key]
    if p["api_key"]:
        cfg["env"] = dict(cfg.get("env") or {}, OPENAI_API_KEY=p["api_key"])  # the client's bearer token
    if p["ca_file"]:
        # Trusted by the client's TLS (OpenSSL in vllm-rs, aiohttp in vllm bench); a path where the client runs.
        cfg["env"] = dict(cfg.get("env") or {}, SSL_CERT_FILE=p["ca_file"])
    problems = sla.validate(sla.merge_config(cfg))
    if problems:
        module.fail_json(msg="sla_gate: invalid input: %s" % "; ".join(problems), passed=False, failures=problems)
    if module.check_mode:
        module.exit_json(changed=False, passed=True, failures=[], validated=True)
    try:
        result = sla.run(p["router_url"], cfg, p["artifacts_dir"])
    except sla.SlaError as exc:
        module.fail_json(msg="sla_gate: %s" % exc, passed=False, failures=[str(exc)])
    files = report.write_sla(p["artifacts_dir"], result)
    out = dict(changed=False, passed=result["passed"], failures=result["failures"], files=files,
               wall_s=result["wall_s"], runs=[{k: r.get(k) for k in RUN_KEYS} for r in result["runs"]])
    if result.get("capacity"):
        out["capacity"] = {k: v for k, v in result["capacity"].items() if k != "probes"}
    if not result["passed"]:
        module.fail_json(msg="SLA gate failed: %s (report %s)" % ("; ".join(result["failures"]), files["markdown"]),
                         **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
