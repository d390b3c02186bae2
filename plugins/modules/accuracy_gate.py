# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: accuracy_gate
short_description: Accuracy smoke test of the deployment through its router (AIME 2025, GPQA Diamond, LongBench v2)
description:
  - Stages the data sets (Hub at a pinned revision with sha256 pins, or a local directory), asks the router's
    chat endpoint with the model card's sampling, grades as the leading harnesses do, and fails when a
    benchmark is below its exact-binomial floor, drops significantly below a reference run, or its parse or
    truncation rate is out of bounds.
  - An action plugin (the collection's plugin_utils C(gates.accuracy)); it runs on the controller, whatever
    the task's host; use C(run_once=true).
  - Writes accuracy.json, accuracy.md, accuracy_items.jsonl and accuracy.png under O(artifacts_dir).
    GPQA items appear there by record id and hash only.
version_added: "0.1.0"
options:
  model:
    description: Served model name; defaults to the first model the router lists.
    type: str
  benchmarks:
    description: Benchmarks to run (default C(config.benchmarks), else all three).
    type: list
    elements: str
    choices: [aime, gpqa, longbench]
  datasets:
    description:
      - Per benchmark, C(repo_id), C(revision) (a 40-hex commit) and C(files) (path in the repository to sha256).
      - Required for a Hub download; with O(local_dir) the sha256 pins are checked when given.
      - Default C(config.datasets).
    type: dict
  local_dir:
    description: Air-gapped sites; the files are read from C(<local_dir>/<repo_id>/<path>) and nothing is fetched.
    type: path
  cache_dir:
    description:
      - Where Hub downloads are kept (default pdctl's cache on the controller, C(~/.cache/pdctl/datasets)
        unless E(PDCTL_CACHE_DIR) or E(XDG_CACHE_HOME) says otherwise).
    type: path
  hf_token:
    description: Hugging Face token for the gated GPQA data set. Never logged.
    type: str
  reference:
    description: C(accuracy.json) of a known-good deployment; enables the drop test (exact one-sided Fisher test).
    type: path
  config:
    description:
      - Further settings of the accuracy gate's C(DEFAULTS), for example C(concurrency), C(time_budget_s),
        C(seed), C(alpha), C(min_parse_rate), C(max_truncation_rate), C(max_failed_share), and per benchmark
        C(samples), C(repeats), C(expected_accuracy), C(floor), C(max_tokens), C(buckets).
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
- name: Accuracy gate through the router
  pdctl.vllm_pd.accuracy_gate:
    router_url: "{{ pdctl_plan.frontdoor.url }}"
    datasets: "{{ pdctl_gate_accuracy.datasets }}"
    hf_token: "{{ pdctl_gate_hf_token }}"
    reference: "{{ playbook_dir }}/../artifacts/gates/known-good/accuracy.json"
    artifacts_dir: "{{ playbook_dir }}/../artifacts/gates/{{ ansible_date_time.iso8601_basic_short }}"
    config:
      gpqa: {samples: 64}
      longbench: {buckets: {short: 20, medium: 20, long: 20}}
  run_once: true
"""

RETURN = r"""
passed:
  description: Whether every benchmark passed every check.
  type: bool
  returned: always
  sample: true
benchmarks:
  description: Per benchmark; samples, correct, accuracy, floor, parse_rate, truncation_rate, errors, timeouts, checks.
  type: dict
  returned: unless check mode
  sample: {"gpqa": {"samples": 64, "correct": 59, "floor": 52, "parse_rate": 1.0, "passed": true}}
failures:
  description: One line per failed check, naming the benchmark and the measured value.
  type: list
  elements: str
  returned: always
  sample: ["gpqa: 40/64 correct (62.5%) is below the floor 52 (...)"]
files:
  description: Report files written.
  type: dict
  returned: unless check mode
  sample: {"json": "artifacts/gates/20261129T120000Z/accuracy.json"}
wall_s:
  description: Wall time of the gate in seconds.
  type: float
  returned: unless check mode
  sample: 512.3
"""
