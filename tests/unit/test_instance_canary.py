# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""instance_canary (the vllm role's start_instance) against a real HTTP server that plays a starting vLLM
instance: /health refused until it is ready, /v1/completions with a scripted answer. In-process
(tests/module_harness.py); the verdict itself, rolling.canary_verdict, on plain data."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from module_harness import run

from ansible_collections.pdctl.vllm_pd.plugins.module_utils.rolling import canary_verdict

REQUEST = {"prompt": "pdctl canary: the capital of France is", "max_tokens": 8, "temperature": 0, "model": "/m"}
KEY = "sk-canary-secret"


def completion(text, finish="length", tokens=8):
    """A /v1/completions answer; the canary asks for 8 tokens (playbooks/vars/canary.yml)."""
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish}],
            "usage": {"prompt_tokens": 7, "completion_tokens": tokens, "total_tokens": 7 + (tokens or 0)}}


class Instance:
    """/health answers 503 for the first `loading` reads, then 200; /v1/completions answers `statuses` in turn
    (the last stays), with `answer` on a 200; every request is kept (path, Authorization, body)."""

    def __init__(self, loading=0, statuses=(200,), answer=None):
        self.loading, self.statuses, self.answer, self.seen = loading, list(statuses), answer, []
        instance = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, status, body=None):
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                instance.seen.append((self.path, None, None))
                if instance.loading > 0:
                    instance.loading -= 1
                    self._reply(503)
                else:
                    self._reply(200 if self.path == "/health" else 404)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                instance.seen.append((self.path, self.headers.get("Authorization"), body))
                status = instance.statuses.pop(0) if len(instance.statuses) > 1 else instance.statuses[0]
                self._reply(status, instance.answer if status == 200 else {"error": "loading"})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def instance():
    made = []

    def make(**kw):
        made.append(Instance(**kw))
        return made[-1]
    yield make
    for inst in made:
        inst.close()


def canary(inst, capsys, check_mode=False, **args):
    return run("instance_canary", dict({"url": inst.url, "api_key": KEY, "request": REQUEST, "poll_s": 0.05,
                                        "health_timeout": 30}, **args), capsys, check_mode=check_mode)


def test_waits_for_health_then_asks_the_canary_with_the_key(instance, capsys):
    inst = instance(loading=3, answer=completion(" Paris, the city of"))
    failed, res, out = canary(inst, capsys)
    assert not failed and res["ok"] and res["text"] == " Paris, the city of" and res["msg"] == ""
    assert [p for p, dummy, dummy2 in inst.seen] == ["/health"] * 4 + ["/v1/completions"]
    assert inst.seen[-1][1:] == ("Bearer " + KEY, REQUEST)
    assert KEY not in out   # no_log: the key never shows in the result


def test_the_answer_on_the_previous_configuration_must_be_the_same(instance, capsys):
    inst = instance(answer=completion(" Lyon"))
    failed, res, dummy = canary(inst, capsys, expect=" Paris")
    assert not failed and not res["ok"]   # the caller stops the instance, then fails
    assert res["msg"] == ('answers the canary " Lyon" (finish_reason length, 8 of 8 tokens), on its previous '
                          'configuration " Paris"')
    failed, res, dummy = canary(inst, capsys, expect=" Lyon")
    assert not failed and res["ok"]


def test_a_canary_not_answered_yet_is_sent_again(instance, capsys):
    inst = instance(statuses=(503, 503, 200), answer=completion(" Paris", "stop"))
    failed, res, dummy = canary(inst, capsys)
    assert not failed and res["ok"] and [p for p, dummy, dummy2 in inst.seen].count("/v1/completions") == 3


def test_no_200_fails_naming_the_url(instance, capsys):
    inst = instance(statuses=(503,))
    failed, res, dummy = canary(inst, capsys, canary_tries=2)
    assert failed and res["msg"] == "%s/v1/completions did not answer the canary with 200 in 2 tries (last: 503)" % inst.url
    never = instance(loading=10 ** 6)
    failed, res, dummy = canary(never, capsys, health_timeout=0)
    assert failed and res["msg"] == "%s/health did not answer 200 within 0 s" % never.url


def test_check_mode_sends_nothing(instance, capsys):
    inst = instance(answer=completion(""))
    failed, res, dummy = canary(inst, capsys, check_mode=True)
    assert not failed and res["ok"] and inst.seen == []


@pytest.mark.parametrize("answer, expect, ok", [
    (completion(" Paris"), "", True),
    (completion(" Paris", "stop"), " Paris", True),
    (completion(""), "", False),                          # nothing said
    (completion(" Paris", "abort"), "", False),           # not of the length asked
    (completion(" Paris", None), "", False),
    ({"choices": []}, "", False),
    ({}, "", False),
    (None, "", False),
    (completion(" Paris"), " Lyon", False),                # another answer than before the restart
    (completion(" Paris", "length", 3), "", False),       # cut: 3 of the 8 tokens asked
    (completion(" Paris", "stop", 0), "", False),         # a usage of no token beside text
    (completion(" Paris", "stop", 2), "", True),
    ({"choices": [{"text": " Paris", "finish_reason": "length"}]}, "", False),  # no usage: a cut one looks the same
    (dict(completion(" Paris"), error={"code": 500}), "", False),
])
def test_canary_verdict(answer, expect, ok):
    got = canary_verdict(answer, expect, 8)
    assert got["ok"] is ok and bool(got["msg"]) is not ok
