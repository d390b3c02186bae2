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
  - An action plugin (the collection's plugin_utils C(gates.sla)); it runs on the controller, whatever the task's
    host; use C(run_once=true). The client itself may run on a serving host through O(exec_prefix) (for
    example C(ssh decode-0)).
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
  - ansible.builtin.action_common_attributes.flow
  - pdctl.vllm_pd.attributes
  - pdctl.vllm_pd.gate_client
  - pdctl.vllm_pd.gate_settings
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
"""

EXAMPLES = r"""
- name: SLA gate at 16K-256K, client on the decode host
  pdctl.vllm_pd.sla_gate:
    router_url: "{{ pdctl_plan.frontdoor.url }}"
    exec_prefix: [ssh, -o, BatchMode=yes, "{{ groups['decode'][0] }}"]
    client: ["{{ pdctl_paths.venvs }}/current/bin/vllm", bench, serve]
    capacity: {enabled: true, max: 128}
    artifacts_dir: "{{ playbook_dir }}/../artifacts/gates/{{ ansible_date_time.iso8601_basic_short }}"
  run_once: true
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
