# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one rule for whether a completion request succeeded, used by the load generator, the benchmarks,
the gates, the canary module (instance_canary, on the hosts: hence module_utils, standard library only) and the
lab tests.

A request is ok when all of these hold:
- HTTP 200;
- a stream reached ``data: [DONE]`` (a non-streamed answer is complete by construction);
- the finish_reason is ``stop`` or ``length``;
- the token count is the one the request allowed for: ``length`` means exactly max_tokens, ``stop`` means at
  least one and at most max_tokens (a count that is not known fails: without it a truncated answer cannot be told
  apart; an answer that stops with no token generated nothing);
- the usage agrees with the answer: a stream that carried generated text reports at least one token.

Anything else is a failure of one kind (the first that applies, in this order):
- ``status``: no HTTP response, or a status other than 200;
- ``cut``: the stream ended (or the connection broke) before ``[DONE]``, or ended without a finish_reason;
- ``abort``: the server ended the request itself: finish_reason ``abort`` / ``error`` / anything but stop or
  length, or an error event in the stream (vLLM reports an aborted or drain-expired request with HTTP 200,
  ``finish_reason: "abort"`` and ``[DONE]``);
- ``short``: stop/length with the wrong number of tokens (none for ``stop``, or a usage of 0 beside text).
"""
from __future__ import annotations

import json

KINDS = ("status", "cut", "abort", "short")


def failure_kind(status: int | None, done: bool, finish_reason: str | None, tokens: int | None,
                 max_tokens: int | None, error: bool = False, text: bool = False) -> str | None:
    """None when the request is ok, else its failure kind (one of KINDS). text: the answer carried generated text
    (a usage of 0 tokens beside it does not agree)."""
    if status != 200:
        return "status"
    if error:
        return "abort"
    if not done:
        return "cut"
    if finish_reason is None:
        return "cut"
    if finish_reason not in ("stop", "length"):
        return "abort"
    if tokens is None or max_tokens is None:
        return "short"
    if finish_reason == "length" and tokens != max_tokens:
        return "short"
    if finish_reason == "stop" and not 1 <= tokens <= max_tokens:
        return "short"
    if text and tokens < 1:
        return "short"
    return None


class StreamReader:
    """Reads an OpenAI-style SSE stream line by line and keeps what the rule needs: [DONE], the last
    finish_reason, the completion tokens (the usage chunk's: ask for it with stream_options.include_usage;
    chunks are no count, a speculative-decoding chunk carries several tokens) and any error event."""

    def __init__(self):
        self.done, self.finish_reason, self.error = False, None, ""
        self.tokens: int | None = None
        self.content = False  # a chunk with generated text (or reasoning) has come: the first token

    def feed(self, line: str) -> None:
        if not line.startswith("data: "):
            return
        data = line[6:].strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            event = json.loads(data)
        except ValueError:
            self.error = self.error or "unparsable event: " + data[:150]
            return
        if "error" in event:
            self.error = self.error or json.dumps(event["error"])[:200]
        usage = event.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            self.tokens = int(usage["completion_tokens"])
        for choice in event.get("choices") or []:
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or choice.get("text"):
                self.content = True

    def kind(self, status: int | None, max_tokens: int | None) -> str | None:
        return failure_kind(status, self.done, self.finish_reason, self.tokens, max_tokens, bool(self.error),
                            self.content)


def of_response(status: int | None, body: dict | None, max_tokens: int | None) -> str | None:
    """The failure kind of a non-streamed answer (its JSON body), None when ok."""
    if status != 200:
        return "status"
    body = body or {}
    if "error" in body:
        return "abort"
    choices = body.get("choices") or [{}]
    tokens = (body.get("usage") or {}).get("completion_tokens")
    message = choices[0].get("message") or {}
    text = bool(choices[0].get("text") or message.get("content") or message.get("reasoning_content")
                or message.get("reasoning"))
    return failure_kind(status, True, choices[0].get("finish_reason"), tokens, max_tokens, text=text)


def count_kinds(kinds) -> dict:
    """{kind: count} for every kind in KINDS (zeros included), from an iterable of kinds/None."""
    out = dict.fromkeys(KINDS, 0)
    for kind in kinds:
        if kind is not None:
            out[kind] += 1
    return out
