"""The latency/answers/faults profile (YAML), from $PDCTL_ENGINE_PROFILE, over this release's
traits (pdctl.lab.engine.RELEASE["profile"]), over the built-in defaults."""
from __future__ import annotations

import copy
import os

import yaml

DEFAULTS = {
    "latency": {
        "prefill_tokens_per_s": 200000,
        "prefill_overhead_ms": 20,
        "decode_step_ms": 30,
        "decode_step_ms_per_request": 0.05,
        "decode_slowdown": 1.0,             # multiplies every decode step (release bad-sla: several x)
        "mtp_acceptance_rate": 0.8,
        "kv_bytes_per_token": 1024,
    },
    "answers": {"key": "", "correct_rate": None, "mode": "normal"},
    "faults": {
        "crash_after_requests": 0,
        "refuse_side_channel": False,
        "leak_rss_mb_per_min": 0,
        "leak_rss_mb_per_request": 0,
        "slow_start_s": 0,
        "dead_peer_timeout_s": 0,           # a KV pull from an unreachable peer fails after this long
    },
}


def _merge(profile: dict, data: dict, where: str) -> None:
    for section, values in data.items():
        if section not in profile:
            raise ValueError(f"{where}: unknown profile section {section!r}")
        for key, value in (values or {}).items():
            if key not in profile[section]:
                raise ValueError(f"{where}: unknown key {section}.{key}")
            profile[section][key] = value


def load(path: str | None = None, release: dict | None = None) -> dict:
    """Merge the YAML profile over the release's traits over the defaults; unknown sections or
    keys are an error. release: a RELEASE dict (default: this installed release's)."""
    path = path if path is not None else os.environ.get("PDCTL_ENGINE_PROFILE", "")
    if release is None:
        from pdctl.lab.engine import RELEASE as release
    profile = copy.deepcopy(DEFAULTS)
    _merge(profile, release.get("profile") or {}, "release %s" % release.get("name"))
    if path:
        with open(path, encoding="utf-8") as fh:
            _merge(profile, yaml.safe_load(fh) or {}, path)
    if profile["answers"]["mode"] not in ("normal", "unparsable"):
        raise ValueError(f"{path}: answers.mode must be normal or unparsable")
    return profile


def tokens_per_step(rate: float, num_speculative_tokens: int) -> float:
    """Expected tokens per decode step with MTP: 1 + sum_{k=1..N} rate^k."""
    return 1.0 + sum(rate**k for k in range(1, num_speculative_tokens + 1))


def expected_ttft_s(profile: dict, prompt_tokens: int) -> float:
    lat = profile["latency"]
    return lat["prefill_overhead_ms"] / 1000 + prompt_tokens / lat["prefill_tokens_per_s"]


def expected_tpot_s(profile: dict, running: int, num_speculative_tokens: int) -> float:
    lat = profile["latency"]
    return decode_step_s(profile, running) / tokens_per_step(lat["mtp_acceptance_rate"], num_speculative_tokens)


def decode_step_s(profile: dict, running: int) -> float:
    """One decode step of a batch of `running` requests (the release's slowdown included)."""
    lat = profile["latency"]
    return (lat["decode_step_ms"] + lat["decode_step_ms_per_request"] * running) * lat["decode_slowdown"] / 1000
