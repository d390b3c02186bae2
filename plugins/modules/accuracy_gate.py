#!/usr/bin/python
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
  - Thin wrapper over C(pdctl.gates.accuracy); it must run on the controller with the pdctl virtualenv's
    python (C(delegate_to=localhost), C(run_once=true),
    C(ansible_python_interpreter="{{ ansible_playbook_python }}")).
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
    description: Where Hub downloads are kept (default C(~/.cache/pdctl/datasets)).
    type: path
  hf_token:
    description: Hugging Face token for the gated GPQA data set. Never logged.
    type: str
  reference:
    description: C(accuracy.json) of a known-good deployment; enables the drop test (exact one-sided Fisher test).
    type: path
  config:
    description:
      - Further settings of C(pdctl.gates.accuracy.DEFAULTS), for example C(concurrency), C(time_budget_s),
        C(seed), C(alpha), C(min_parse_rate), C(max_truncation_rate), and per benchmark
        C(samples), C(repeats), C(expected_accuracy), C(floor), C(max_tokens), C(buckets).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - pdctl.vllm_pd.attributes
  - pdctl.vllm_pd.gate_client
  - pdctl.vllm_pd.gate_settings
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
  delegate_to: localhost
  run_once: true
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
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

from ansible.module_utils.basic import AnsibleModule

BENCHMARKS = ["aime", "gpqa", "longbench"]


def build_module():
    return AnsibleModule(
        argument_spec=dict(
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
        ),
        supports_check_mode=True,
    )


def main():
    module = build_module()
    p = module.params
    try:
        from pdctl.gates import accuracy, datasets, report
    except ImportError as exc:
        module.fail_json(msg="accuracy_gate needs the pdctl package (%s): run it on the controller with "
                             "ansible_python_interpreter set to the pdctl virtualenv's python" % exc)
    cfg = dict(p["config"])
    if p["api_key"]:
        cfg["api_key"] = p["api_key"]
    if p["ca_file"]:
        cfg["ca_file"] = p["ca_file"]
    cfg.update({key: p[key] for key in ("benchmarks", "datasets", "local_dir", "cache_dir") if p[key] is not None})
    problems = accuracy.validate(accuracy.merge_config(cfg))
    if p["reference"]:
        try:
            reference = accuracy.load_reference(p["reference"])
        except (OSError, ValueError, KeyError) as exc:
            problems.append("reference %s unreadable: %s" % (p["reference"], exc))
    else:
        reference = None
    if problems:
        module.fail_json(msg="accuracy_gate: invalid input: %s" % "; ".join(problems), passed=False,
                         failures=problems)
    if module.check_mode:
        module.exit_json(changed=False, passed=True, failures=[], validated=True)
    try:
        result, rows = accuracy.run(p["router_url"], cfg, model=p["model"], token=p["hf_token"], reference=reference)
    except datasets.DatasetError as exc:
        module.fail_json(msg="accuracy_gate: data set: %s" % exc, passed=False, failures=[str(exc)])
    except Exception as exc:  # the router did not answer at all (connection refused, HTTP error on /v1/models)
        module.fail_json(msg="accuracy_gate: %s at %s: %s" % (type(exc).__name__, p["router_url"], exc),
                         passed=False, failures=[str(exc)])
    files = report.write_accuracy(p["artifacts_dir"], result, rows)
    out = dict(changed=False, passed=result["passed"], benchmarks=result["benchmarks"],
               failures=result["failures"], files=files, wall_s=result["wall_s"])
    if not result["passed"]:
        module.fail_json(msg="accuracy gate failed: %s (report %s)" % ("; ".join(result["failures"]), files["markdown"]),
                         **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
