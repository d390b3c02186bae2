"""The one request-outcome rule, for pdctl's own users (the lab's load generator, benchmarks, tests).

It lives in the collection (plugins/module_utils/outcome.py), where the gates' action plugins and the canary
module (instance_canary, on the hosts) use it too.
"""
from __future__ import annotations

from ansible_collections.pdctl.vllm_pd.plugins.module_utils.outcome import (  # noqa: F401
    KINDS, StreamReader, count_kinds, failure_kind, of_response)
