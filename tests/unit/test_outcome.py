"""The one request-outcome rule (pdctl.outcome), and the lab's load generator using it against a scripted
server that ends streams the ways vLLM can (a drain-expired request: finish_reason abort, then [DONE])."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pdctl import outcome
from pdctl.lab.load import Outcome, StreamLoad


@pytest.mark.parametrize("status,done,finish,tokens,max_tokens,error,kind", [
    (200, True, "length", 24, 24, False, None),
    (200, True, "stop", 7, 24, False, None),
    (200, True, "stop", 24, 24, False, None),
    (None, False, None, None, 24, False, "status"),
    (503, False, None, None, 24, False, "status"),
    (200, False, "length", 24, 24, False, "cut"),       # no [DONE]
    (200, True, None, 2, 24, False, "cut"),             # [DONE] without a finish_reason
    (200, True, "abort", 2, 24, False, "abort"),
    (200, True, "error", 0, 24, False, "abort"),
    (200, True, "repetition", 9, 24, False, "abort"),
    (200, True, "length", 24, 24, True, "abort"),       # an error event in the stream
    (200, True, "length", 2, 24, False, "short"),
    (200, True, "stop", 25, 24, False, "short"),
    (200, True, "length", None, 24, False, "short"),    # no count: a cut answer could not be told apart
    (200, True, "stop", 0, 24, False, "short"),         # stopped having generated nothing
    (200, True, "stop", 1, 24, False, None),
])
def test_failure_kind(status, done, finish, tokens, max_tokens, error, kind):
    assert outcome.failure_kind(status, done, finish, tokens, max_tokens, error) == kind


def test_a_usage_of_no_token_beside_generated_text_does_not_agree():
    assert outcome.failure_kind(200, True, "stop", 0, 24, text=True) == "short"
    assert outcome.failure_kind(200, True, "length", 0, 0, text=True) == "short"
    assert outcome.failure_kind(200, True, "stop", 3, 24, text=True) is None
    reader = outcome.StreamReader()
    for line in ['data: {"choices": [{"delta": {"content": "Hi"}, "finish_reason": null}]}',
                 'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}',
                 'data: {"choices": [], "usage": {"completion_tokens": 0}}', "data: [DONE]"]:
        reader.feed(line)
    assert reader.kind(200, 24) == "short"


def test_non_streamed_answers():
    def body(finish, tokens):
        return {"choices": [{"finish_reason": finish}], "usage": {"completion_tokens": tokens}}

    assert outcome.of_response(200, body("length", 16), 16) is None
    assert outcome.of_response(200, body("stop", 5), 16) is None
    assert outcome.of_response(200, body("abort", 2), 16) == "abort"
    assert outcome.of_response(200, body("length", 2), 16) == "short"
    assert outcome.of_response(200, {"error": {"code": 500}}, 16) == "abort"
    assert outcome.of_response(200, body("stop", 0), 16) == "short"
    with_text = {"choices": [{"finish_reason": "length", "message": {"content": "x"}}], "usage": {"completion_tokens": 0}}
    assert outcome.of_response(200, with_text, 0) == "short"
    assert outcome.of_response(500, None, 16) == "status"


def test_an_outcome_built_without_a_kind_is_judged_by_the_rule():
    assert not Outcome(0, 1, 200, True).ok                        # [DONE] alone is no longer enough
    assert Outcome(0, 1, 200, True, finish_reason="length", tokens=4, max_tokens=4).ok
    assert Outcome(0, 1, 200, True, finish_reason="abort", tokens=2, max_tokens=4).kind == "abort"


MAX = 24


def _chunk(finish=None, text="x"):
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text},
                                                             "finish_reason": finish}]}


def _usage(n):
    return {"object": "chat.completion.chunk", "choices": [], "usage": {"completion_tokens": n}}


# What each scripted server sends (chosen by the client's key): HTTP status, then SSE events.
SCRIPTS = {
    "whole": (200, [_chunk() for _ in range(MAX - 1)] + [_chunk("length"), _usage(MAX), "[DONE]"]),
    "abort": (200, [_chunk(), _chunk("abort"), _usage(2), "[DONE]"]),
    "short": (200, [_chunk(), _chunk("length"), _usage(2), "[DONE]"]),
    "cut": (200, [_chunk(), _chunk()]),
    "error-event": (200, [_chunk(), {"error": {"message": "Internal server error", "code": 500}}, "[DONE]"]),
    "unavailable": (503, []),
}


def _answer(finish, tokens):
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "The answer is 7."},
                         "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens}}


# Non-streamed answers (the gates' clients): the JSON body.
ANSWERS = {"answer-ok": _answer("stop", 5), "answer-abort": _answer("abort", 2), "answer-short": _answer("length", 3),
           "answer-error-body": dict(_answer("stop", 5), error={"message": "Internal server error", "code": 500})}


class _Scripted(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        script = self.headers["Authorization"].split()[-1]
        if script in ANSWERS:
            body = json.dumps(ANSWERS[script]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        status, events = SCRIPTS[script]
        if status != 200:
            body = b'{"error": "unavailable"}'
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for event in events:
            data = event if isinstance(event, str) else json.dumps(event)
            self.wfile.write(("data: %s\n\n" % data).encode())
        self.close_connection = True


@pytest.fixture(scope="module")
def scripted():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()


@pytest.mark.parametrize("script,kind", [("whole", None), ("abort", "abort"), ("short", "short"),
                                         ("cut", "cut"), ("error-event", "abort"), ("unavailable", "status")])
def test_stream_load_judges_each_request_by_the_rule(scripted, script, kind):
    load = StreamLoad(scripted, script, clients=1, max_tokens=MAX)
    with load:
        deadline = time.monotonic() + 10
        while len(load.outcomes) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    summary = load.summary()
    assert summary["requests"] >= 3
    assert {o.kind for o in load.outcomes} == {kind}
    expected = dict.fromkeys(outcome.KINDS, 0)
    if kind:
        expected[kind] = summary["requests"]
    assert summary["failed_by_kind"] == expected
    assert summary["failed_requests"] == (summary["requests"] if kind else 0)
    # A stream's TTFT is its first chunk with text; a refused request has none.
    assert all((o.ttft is None) == (script == "unavailable") for o in load.outcomes)
    assert all(0 <= o.ttft <= o.end - o.start for o in load.outcomes if o.ttft is not None)
    # the keys callers read before the rule existed are all still there
    assert {"requests", "failed_requests", "failure_window_s", "errors"} <= set(summary)


@pytest.mark.parametrize("script,kind", [("answer-ok", None), ("answer-abort", "abort"), ("answer-short", "short")])
def test_the_soak_gate_judges_its_requests_by_the_rule(scripted, script, kind):
    from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import soak

    cfg = soak.settings({"api_key": script, "max_tokens": 16})
    stop, out = threading.Event(), []
    worker = threading.Thread(target=soak._load, args=(scripted, cfg, "m", stop, time.monotonic(), out,
                                                       threading.Lock()))
    worker.start()
    deadline = time.monotonic() + 10
    while len(out) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    worker.join(10)
    assert out and {r["kind"] for r in out} == {kind} and all(r["ok"] == (kind is None) for r in out)


@pytest.mark.parametrize("script,kind", [("answer-ok", None), ("answer-abort", "abort"), ("answer-short", "short"),
                                         ("answer-error-body", "abort")])
def test_the_accuracy_gate_counts_an_aborted_answer_as_an_error(scripted, script, kind):
    import asyncio

    from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import accuracy, datasets

    item = datasets.Item(benchmark="aime", id="1", prompt="What is 3+4?", answer=7, meta={})
    cfg = accuracy.merge_config({"api_key": script})
    record = asyncio.run(accuracy.ask_all(scripted, "m", [(item, 0, {"max_tokens": 16})], cfg))[0]
    assert record["status"] == ("ok" if kind is None else "error")
    assert record.get("failure_kind") == kind
    assert record["correct"] == (kind is None)  # the same text, graded only when the request was ok


def test_the_accuracy_gate_fails_on_failed_requests_whatever_the_accuracy():
    from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import accuracy

    cfg = accuracy.merge_config({})
    ok = {"status": "ok", "correct": True, "parsed": True}
    failed = {"status": "error", "failure_kind": "status", "correct": False, "parsed": False}
    # 60 of 64 right (above any floor) but 4 requests failed: 6% > 2%.
    rows = [dict(ok) for _ in range(60)] + [dict(failed) for _ in range(4)]
    summary = accuracy.summarize("gpqa", rows, dict(cfg["gpqa"], floor=10), cfg, None)
    assert not summary["passed"]
    (check,) = [c for c in summary["checks"] if c["name"] == "failed_share"]
    assert not check["ok"] and "4 of 64 requests failed (6.2%: 4 status" in check["message"], check
    # One failure in 64 (1.6%) is within the stated share; the others pass as before.
    rows = [dict(ok) for _ in range(63)] + [dict(failed)]
    assert accuracy.summarize("gpqa", rows, dict(cfg["gpqa"], floor=10), cfg, None)["passed"]
    # Unasked questions (the time budget) count as failed too.
    rows = [dict(ok) for _ in range(60)] + [{"status": "timeout", "correct": False, "parsed": False}] * 4
    assert not accuracy.summarize("gpqa", rows, dict(cfg["gpqa"], floor=10), cfg, None)["passed"]


def test_the_stream_reader_sees_the_first_generated_text_not_the_role_chunk():
    reader = outcome.StreamReader()
    reader.feed('data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}')
    assert not reader.content  # vLLM's first chunk names the role and carries no token
    reader.feed('data: {"choices": [{"index": 0, "delta": {"reasoning_content": "Let"}}]}')
    assert reader.content
    plain = outcome.StreamReader()
    plain.feed('data: {"choices": [{"index": 0, "text": " GPUs", "finish_reason": null}]}')  # /v1/completions
    assert plain.content
