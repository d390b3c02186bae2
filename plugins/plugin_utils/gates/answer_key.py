"""Answer key for the lab's stand-in engine (the contract with src/pdctl/lab/engine).

Format: {"correct_rate": 0.9, "entries": {"<sha256 hex of the last user message content, utf-8>":
{"correct": "<full response text>", "wrong": "<full response text>", "reasoning": "<optional>"}}}.
The stand-in answers "correct" iff int(sha[:8], 16) / 2**32 < correct_rate, and "wrong" otherwise
(its profile may instead set ``answers.mode: unparsable``).

Responses are written so that this package's extractors read them as intended; GPQA responses carry only a
letter, never item text, so a key built from the real GPQA set still holds no GPQA item.
"""
from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import datasets, prompts


def responses(item: datasets.Item) -> dict:
    """{"correct", "wrong", "reasoning"} response texts for one item."""
    if item.benchmark == "aime":
        right = int(item.answer)
        wrong = (right + 1) % 1000
        return {"correct": "Adding the cases gives the total.\n\nThe answer is $\\boxed{%d}$." % right,
                "wrong": "Adding the cases gives the total.\n\nThe answer is $\\boxed{%d}$." % wrong,
                "reasoning": "Consider the cases one by one."}
    letter = item.answer.strip().upper()
    other = prompts.LETTERS[(prompts.LETTERS.index(letter) + 1) % 4]
    if item.benchmark == "gpqa":
        return {"correct": "Eliminating the other options leaves one.\nANSWER: %s" % letter,
                "wrong": "Eliminating the other options leaves one.\nANSWER: %s" % other,
                "reasoning": "Compare the options."}
    return {"correct": "The correct answer is (%s)" % letter, "wrong": "The correct answer is (%s)" % other,
            "reasoning": "Find the relevant passage."}


def predicted_correct(prompt_sha256: str, rate: float) -> bool:
    """The stand-in's rule, so tests can know in advance which items it will answer correctly."""
    return int(prompt_sha256[:8], 16) / 2 ** 32 < rate


def build(items: list[datasets.Item], correct_rate: float = 0.9) -> dict:
    return {"correct_rate": correct_rate,
            "entries": {item.prompt_sha256: responses(item) for item in items}}


def write(path, items: list[datasets.Item], correct_rate: float = 0.9) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(build(items, correct_rate), indent=1, sort_keys=True))
    return path


def build_from_config(config: dict, correct_rate: float = 0.9) -> dict:
    """A key for exactly the items an accuracy gate with this configuration will ask (local_dir required)."""
    from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import accuracy

    cfg = accuracy.merge_config(config)
    items = []
    for name in cfg["benchmarks"]:
        found, _problems = datasets.load_benchmark(name, cfg["datasets"].get(name) or {}, cfg[name], int(cfg["seed"]),
                                                   local_dir=cfg["local_dir"], cache_dir=cfg["cache_dir"])
        items += found
    return build(items, correct_rate)
