"""Rollout gates: an accuracy smoke test and an SLA (latency) gate, run from the controller.

- ``datasets``: stage the evaluation data sets (Hub at a pinned revision, or a local directory), sha256-checked.
- ``prompts``: prompt builders and answer extraction for AIME 2025, GPQA Diamond and LongBench v2.
- ``accuracy``: ask the router, grade, and decide (floor, reference run, parse and truncation rates).
- ``sla``: run ``vllm bench serve`` (or ``vllm-rs``) per context length, decide, and search the SLA capacity.
- ``stats``: exact binomial arithmetic behind the floors and tolerances.
- ``report``: JSON, Markdown and PNG reports under an artifacts directory.
- ``answer_key``: build the answer key the lab's stand-in engine answers from.
"""
