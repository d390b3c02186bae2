"""The stand-in's HTTP server (aiohttp): vLLM 0.33's OpenAI API, /metrics, P/D KV hand-off,
profile-driven timing, SIGTERM drain and the profile's faults.

Processes as in vLLM 0.33 (checked against the wheel: tests/unit/test_engine_conformance.py): this API
server process plus one engine-core process per local DP rank. A SIGTERM to the API server drains
(--shutdown-timeout), then it stops its engine cores itself. A SIGTERM to an engine core is a drain too
(vLLM's EngineCore: shutdown requested): its rank finishes what it has, answers new requests with
finish_reason "abort" and the core exits once idle. While the API server drains, its HTTP server still
takes requests (and /health answers 200: vLLM's reports only a dead engine); new ones end at once with
HTTP 200 and finish_reason "abort", as vLLM's engine core rejects work added during its shutdown. An
engine core that dies while the server is not stopping (a crash, a kill -9) kills the requests in
flight, and the API server exits with an error."""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import signal
import socket
import sys
import time
import uuid

from aiohttp import web

from pdctl.lab.engine import RELEASE, answers, kv
from pdctl.lab.engine import profile as engine_profile
from pdctl.lab.engine.args import kv_role, num_speculative_tokens
from pdctl.lab.engine.metrics import EngineMetrics

log = logging.getLogger("pdctl.lab.engine")
GOLDEN = 0.6180339887498949
BLOCK_SIZE = 64
KV_CAPACITY_TOKENS = 1_000_000  # per DP rank, for vllm:kv_cache_usage_perc only
DEFAULT_MAX_NUM_SEQS = 1024
TRACE = bool(os.environ.get("PDCTL_ENGINE_TRACE"))
# An engine core: nothing to compute here; it lives until its API server closes the pipe. SIGTERM or
# SIGINT is vLLM's "shutdown requested": the core tells its API server (a line on stdout), which drains
# the core's rank and then closes the pipe. The leak faults live here, as the recipe's leak did (in the
# scheduler, i.e. the engine-core processes): a line "leak N" on its stdin makes the core keep N more bytes,
# every page touched, never released. So the API server's own RSS (process_resident_memory_bytes) does not
# show it; only the unit's memory does (roles/monitoring's pdctl_unit_memory_anon_bytes).
ENGINE_CORE = ("import os, signal, sys\n"
               "def requested(signum, frame):\n"
               "    os.write(1, b'shutdown requested %d\\n' % signum)\n"
               "signal.signal(signal.SIGTERM, requested)\n"
               "signal.signal(signal.SIGINT, requested)\n"
               "kept = []\n"
               "for line in sys.stdin.buffer:\n"
               "    if line.startswith(b'leak '):\n"
               "        block = bytearray(int(line.split()[1]))\n"
               "        block[::4096] = b'\\x01' * len(range(0, len(block), 4096))\n"
               "        kept.append(block)\n")
# vLLM's API-key middleware guards only these path prefixes (serve/middleware/authenticate.py):
# /invocations, /scale_elastic_ep, /metrics, /health and the rest need no key.
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")


def loop_now() -> float:
    return asyncio.get_running_loop().time()


class RequestFailed(Exception):
    def __init__(self, status: int, err_type: str, message: str):
        super().__init__(message)
        self.status, self.err_type, self.message = status, err_type, message


def error_body(status: int, err_type: str, message: str) -> dict:
    return {"error": {"message": message, "type": err_type, "param": None, "code": status}}


def error_response(status: int, err_type: str, message: str) -> web.Response:
    return web.json_response(error_body(status, err_type, message), status=status)


class Rank:
    """One DP rank: its decode batch and its admission queue."""

    def __init__(self, index: int, max_num_seqs: int):
        self.index = index
        self.in_flight = 0       # requests given to this rank and not finished
        self.stopping = False    # its engine core was asked to shut down: new requests are aborted
        self.running = 0
        self.waiting = 0
        self.kv_tokens = 0
        self.next_block = 0
        self.slots = asyncio.Semaphore(max_num_seqs)


class Engine:
    def __init__(self, args, profile: dict, tokenizer, chat_template: str, max_model_len: int,
                 release: dict | None = None):
        self.release = release or RELEASE  # this stand-in release's identity (pdctl.lab.releases)
        self.args, self.profile, self.tokenizer = args, profile, tokenizer
        self.max_model_len = max_model_len
        import jinja2

        self.template = jinja2.Environment().from_string(chat_template)
        self.model_name = args.served_model_name
        self.role = kv_role(args)
        kv_cfg = args.kv_transfer_config or {}
        extra = kv_cfg.get("kv_connector_extra_config") or {}
        self.lease_s = float(extra.get("kv_lease_duration", 30))
        self.load_failure_policy = kv_cfg.get("kv_load_failure_policy", "fail")
        self.engine_id = kv_cfg.get("engine_id") or str(uuid.uuid4())
        self.num_spec = num_speculative_tokens(args)
        self.dp = args.data_parallel_size_local or args.data_parallel_size
        self.dp_start = args.data_parallel_start_rank or 0
        self.ranks = [Rank(i, args.max_num_seqs or DEFAULT_MAX_NUM_SEQS) for i in range(self.dp)]
        self.metrics = EngineMetrics(self.model_name, self.dp, self.num_spec > 0, bool(self.role), self.release,
                                     api_servers=args.api_server_count)
        lat = profile["latency"]
        self.lat = lat
        ans = profile["answers"]
        self.key = answers.AnswerKey(ans["key"], ans["correct_rate"], ans["mode"])
        self.faults = profile["faults"]
        self.dead_peer_s = float(self.faults.get("dead_peer_timeout_s") or 0)
        self.side_host = os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost")
        self.side_port = int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600"))
        spec = (args.speculative_config or {}).get("method", "none")
        self.compat = kv.compat_hash(self.release["vllm_version"], args.model, spec)
        self.leases = kv.Leases(self.lease_s, self._lease_expired)
        self.draining = False
        self.dead = False                      # an engine core died: requests in flight were aborted
        self.handlers: set[asyncio.Task] = set()
        self.in_flight = 0
        self.completed = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.cores: list = []                  # the engine-core processes, one per local DP rank
        self._token_cache: dict[bytes, list[int]] = {}

    # ---- bookkeeping ----------------------------------------------------------------------
    def _lease_expired(self, rank: int) -> None:
        self.metrics.nixl_expired.inc(self.metrics.key(rank))

    def _gauges(self) -> None:
        m = self.metrics
        for r in self.ranks:
            key = m.key(r.index)
            m.running.set(key, r.running)
            m.waiting.set(key, r.waiting)
            m.kv_usage.set(key, min(1.0, r.kv_tokens / KV_CAPACITY_TOKENS))

    def cross_release_pair(self, key: tuple, request_id: str, remote: dict | None) -> None:
        """A prefill of another release served this request's prefill: count it, one log line."""
        self.metrics.cross_release.inc(key)
        remote = remote or {}
        log.error("cross-release pair for %s: decode release %s (vLLM %s) refused KV from prefill release %s "
                  "(vLLM %s)", request_id, self.release.get("name"), self.release.get("vllm_version"),
                  remote.get("name", "unknown"), remote.get("vllm_version", "unknown"))

    def pick_rank(self, header: str | None) -> Rank:
        if header is not None and header.strip().isdigit():
            return self.ranks[int(header) % self.dp]
        return min(self.ranks, key=lambda r: (r.running + r.waiting, r.index))

    def step_s(self, rank: Rank) -> float:
        return engine_profile.decode_step_s(self.profile, rank.running)

    def prefill_s(self, prompt_tokens: int) -> float:
        return self.lat["prefill_overhead_ms"] / 1000 + prompt_tokens / self.lat["prefill_tokens_per_s"]

    # ---- prompts --------------------------------------------------------------------------
    @staticmethod
    def _flatten(content) -> str:
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")

    def render_chat(self, body: dict) -> tuple[str, str | None]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestFailed(400, "BadRequestError", "messages must be a non-empty list")
        flat = [{"role": m.get("role", "user"), "content": self._flatten(m.get("content"))} for m in messages]
        last_user = next((m["content"] for m in reversed(flat) if m["role"] == "user"), None)
        prompt = self.template.render(messages=flat, add_generation_prompt=body.get("add_generation_prompt", True))
        return prompt, last_user

    async def count_tokens(self, text: str) -> list[int]:
        """Token ids of text. Encoding runs in a worker thread (the Rust tokenizer releases the
        GIL), so a burst of long prompts does not stall the streams on the event loop. The router
        renders (tokenizes) each prompt on P and D first, so results are kept for a while."""
        key = hashlib.sha1(text.encode()).digest()
        ids = self._token_cache.get(key)
        if ids is None:
            loop = asyncio.get_running_loop()
            enc = await loop.run_in_executor(None, lambda: self.tokenizer.encode_batch([text], add_special_tokens=False))
            ids = enc[0].ids
            if len(self._token_cache) >= 2048:
                self._token_cache.pop(next(iter(self._token_cache)))
            self._token_cache[key] = ids
        return ids

    async def prompt_of(self, kind: str, body: dict) -> tuple[int, str | None]:
        if kind == "chat":
            prompt, last_user = self.render_chat(body)
            return len(await self.count_tokens(prompt)), last_user
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return len(await self.count_tokens(prompt)), prompt
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt), None
        raise RequestFailed(400, "BadRequestError", "prompt must be a string or a list of token ids "
                            "(batched prompts are not supported by the lab stand-in)")

    # ---- output plan ----------------------------------------------------------------------
    def plan(self, body: dict, prompt_tokens: int, last_user: str | None, seed: str):
        """Return (pieces, finish_reason); pieces are (text, is_reasoning) per output token."""
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is None:
            max_tokens = self.max_model_len - prompt_tokens
        max_tokens = int(max_tokens)
        if max_tokens < 1 or prompt_tokens + max_tokens > self.max_model_len:
            raise RequestFailed(400, "BadRequestError",
                                f"This model's maximum context length is {self.max_model_len} tokens. "
                                f"However, your request has {prompt_tokens} input tokens and requests "
                                f"{max_tokens} output tokens. Please reduce the length of the input "
                                f"messages or the completion.")
        min_tokens = int(body.get("min_tokens") or 0)
        ignore_eos = bool(body.get("ignore_eos"))
        found = self.key.answer(last_user)
        if found is None:
            natural = 32 + int(hashlib.sha256(seed.encode()).hexdigest()[:4], 16) % 128
            pieces = [(p, False) for p in answers.lorem_pieces(natural, seed)]
        else:
            reasoning, content = found
            pieces = [(p, True) for p in answers.text_pieces(self.tokenizer, reasoning)]
            pieces += [(p, False) for p in answers.text_pieces(self.tokenizer, content)]
        want = max_tokens if ignore_eos else max(min_tokens, len(pieces))
        if len(pieces) < want:
            pieces += [(p, False) for p in answers.lorem_pieces(want - len(pieces), seed + "+", bool(pieces))]
        finish = "stop"
        if len(pieces) >= max_tokens:
            finish = "length" if (len(pieces) > max_tokens or ignore_eos) else "stop"
            pieces = pieces[:max_tokens]
        return pieces, finish

    # ---- the request lifecycle ------------------------------------------------------------
    async def run(self, req: dict):
        """Async generator of (kind, payload) events: ("first", None), ("tokens", [pieces]),
        ("done", finish_reason). Raises RequestFailed."""
        loop = asyncio.get_running_loop()
        rank: Rank = req["rank"]
        m, key = self.metrics, self.metrics.key(rank.index)
        arrival = req["arrival"]
        rank.waiting += 1
        self._gauges()
        queued = rank.slots.locked()
        await rank.slots.acquire()
        rank.waiting -= 1
        scheduled = loop.time()
        m.queue.observe(key, scheduled - arrival)
        rank.kv_tokens += req["prompt_tokens"]
        try:
            kvp = req["kv_params"] or {}
            if kvp.get("do_remote_prefill"):
                try:
                    t0 = loop.time()
                    nbytes = await kv.pull(kvp.get("remote_host"), int(kvp.get("remote_port")),
                                           kvp.get("remote_request_id", ""), kvp.get("remote_engine_id", ""),
                                           self.compat, release=self.release,
                                           dead_peer_timeout_s=self.dead_peer_s)
                    m.nixl_xfer_time.observe(key, loop.time() - t0)
                    m.nixl_bytes.observe(key, nbytes)
                except (kv.KVPullError, TypeError, ValueError) as exc:
                    m.nixl_failed.inc(key)
                    log.error("KV load failed for %s: %s", req["id"], exc)
                    if getattr(exc, "compat_mismatch", False):
                        self.cross_release_pair(key, req["id"], exc.remote_release)
                    if self.load_failure_policy != "recompute":
                        raise RequestFailed(500, "InternalServerError", "Internal server error") from None
                    await asyncio.sleep(self.prefill_s(req["prompt_tokens"]))
                first_at = loop.time()
            else:
                # Prefill starts when the request got a slot; without a wait that is its receipt,
                # so the stand-in's own parsing overhead is inside the modelled TTFT.
                first_at = (scheduled if queued else arrival) + self.prefill_s(req["prompt_tokens"])
                await asyncio.sleep(max(0.0, first_at - loop.time()))
                m.prompt_tokens.inc(key, req["prompt_tokens"])
            m.prefill_time.observe(key, first_at - scheduled)
            m.ttft.observe(key, first_at - arrival)
            if TRACE:
                log.info("trace %s first=%.4f", req["id"], time.time() - (loop.time() - first_at))
            pieces = req["pieces"]
            sent = 1
            m.generation_tokens.inc(key, 1)
            yield ("tokens", pieces[:1])
            rank.running += 1
            self._gauges()
            try:
                deadline = first_at
                offset = int(hashlib.sha256(req["id"].encode()).hexdigest()[:8], 16) / 2**32
                step = 0
                rate = self.lat["mtp_acceptance_rate"]
                while sent < len(pieces):
                    deadline += self.step_s(rank)
                    step += 1
                    accepted = 0
                    if self.num_spec:
                        u = (offset + step * GOLDEN) % 1.0
                        accepted = sum(1 for j in range(1, self.num_spec + 1) if u < rate**j)
                        m.spec_drafts.inc(key)
                        m.spec_draft_tokens.inc(key, self.num_spec)
                        m.spec_accepted.inc(key, accepted)
                    await asyncio.sleep(max(0.0, deadline - loop.time()))
                    burst = pieces[sent:sent + 1 + accepted]
                    sent += len(burst)
                    m.itl.observe(key, self.step_s(rank))
                    m.generation_tokens.inc(key, len(burst))
                    rank.kv_tokens += len(burst)
                    yield ("tokens", burst)
            finally:
                rank.running -= 1
            end = loop.time()
            m.decode_time.observe(key, end - first_at)
            if len(pieces) > 1:
                m.tpot.observe(key, (end - first_at) / (len(pieces) - 1))
            m.e2e.observe(key, end - arrival)
            m.request_success.inc(key + (req["finish"],))
        finally:
            rank.kv_tokens -= req["prompt_tokens"] + len(req["pieces"])
            rank.kv_tokens = max(0, rank.kv_tokens)
            rank.slots.release()
            self._gauges()

    def kv_params_out(self, req: dict) -> dict | None:
        """What a kv_producer's NixlConnector returns for a prefill leg (do_remote_decode)."""
        kvp = req["kv_params"] or {}
        if not kvp.get("do_remote_decode"):
            return None
        rank: Rank = req["rank"]
        nblocks = max(1, math.ceil(req["prompt_tokens"] / BLOCK_SIZE))
        blocks = [(rank.next_block + i) % 1_000_000 for i in range(nblocks)]
        rank.next_block = (rank.next_block + nblocks) % 1_000_000
        engine_id = f"{self.engine_id}_dp{self.dp_start + rank.index}"
        nbytes = req["prompt_tokens"] * int(self.lat["kv_bytes_per_token"])
        self.leases.add(req["id"], nbytes, rank.index, engine_id)
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [blocks],
            "remote_engine_id": engine_id,
            "remote_request_id": req["id"],
            "remote_host": self.side_host,
            "remote_port": self.side_port + self.dp_start + rank.index,
            "tp_size": self.args.tensor_parallel_size,
            "dcp_size": 1,
            "pp_size": self.args.pipeline_parallel_size,
            "remote_num_tokens": req["prompt_tokens"],
            "remote_blocks_expiry_time": None,
            "remote_registration_generation": 0,
            "transfer_mode": "pull",
        }

    def finished_one(self, rank: Rank) -> None:
        self.completed += 1
        per_request = float(self.faults.get("leak_rss_mb_per_request") or 0)
        if per_request > 0:  # the recipe's leak: the rank's engine core keeps memory per finished request
            self.leak_in_core(rank.index, int(per_request * 1024 * 1024))
        limit = int(self.faults.get("crash_after_requests") or 0)
        if limit and self.completed >= limit:
            log.error("fault injection: crash_after_requests=%d reached, exiting", limit)
            asyncio.get_running_loop().call_later(0.05, os._exit, 1)

    # ---- background tasks -----------------------------------------------------------------
    async def reaper(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.leases.reap()

    async def leaker(self) -> None:
        rate = float(self.faults.get("leak_rss_mb_per_min") or 0)
        if rate <= 0:
            return
        per_tick = int(rate * 1024 * 1024 / 60 / self.dp)  # one tick a second, spread over the engine cores
        while True:
            await asyncio.sleep(1.0)
            for index in range(self.dp):
                self.leak_in_core(index, per_tick)

    def leak_in_core(self, index: int, size: int) -> None:
        """The leak faults: the engine core of DP rank ``index`` keeps ``size`` more bytes (ENGINE_CORE)."""
        core = self.cores[index] if index < len(self.cores) else None
        if core is not None and core.returncode is None and not core.stdin.is_closing():
            core.stdin.write(b"leak %d\n" % size)


# ---- HTTP layer ---------------------------------------------------------------------------
def usage_of(req: dict, completion_tokens: int, engine: Engine) -> dict:
    usage = {"prompt_tokens": req["prompt_tokens"], "total_tokens": req["prompt_tokens"] + completion_tokens,
             "completion_tokens": completion_tokens, "prompt_tokens_details": None}
    if engine.args.enable_prompt_tokens_details:
        usage["prompt_tokens_details"] = {"cached_tokens": 0}
    return usage


async def handle_generate(request: web.Request, kind: str):
    engine: Engine = request.app["engine"]
    arrival = asyncio.get_running_loop().time()  # TTFT counts from receipt, parsing included
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object")
    except (json.JSONDecodeError, ValueError) as exc:
        return error_response(400, "BadRequestError", f"Invalid JSON body: {exc}")
    model = body.get("model")
    if model is not None and model != engine.model_name:
        return error_response(404, "NotFoundError", f"The model `{model}` does not exist.")
    base_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + base_id
    kv_params = body.get("kv_transfer_params")
    if engine.role == "kv_consumer" and not (kv_params or {}).get("do_remote_prefill"):
        # As vLLM's NixlConnector does: a decode instance asked directly (a canary, an operator's curl)
        # loads nothing remote and prefills the prompt itself.
        log.info("request %s without kv_transfer_params: prefilled locally (kv_consumer)", rid)
    try:
        prompt_tokens, last_user = await engine.prompt_of(kind, body)
        if kv_params and kv_params.get("do_remote_decode"):
            pieces, finish = engine.plan({**body, "max_tokens": 1, "ignore_eos": True}, prompt_tokens, last_user, rid)
        else:
            pieces, finish = engine.plan(body, prompt_tokens, last_user, last_user or rid)
    except RequestFailed as exc:
        return error_response(exc.status, exc.err_type, exc.message)
    req = {"id": rid, "arrival": arrival, "prompt_tokens": prompt_tokens, "pieces": pieces, "finish": finish,
           "kv_params": kv_params, "rank": engine.pick_rank(request.headers.get("X-data-parallel-rank"))}
    if engine.draining or req["rank"].stopping:
        # vLLM's engine core rejects work added during its shutdown: HTTP 200, no tokens, "abort".
        req.update(pieces=[], finish="abort")
        log.info("request %s arrived during the shutdown: aborted", rid)
        return await (_stream(request, engine, req, kind, body) if body.get("stream") else _full(engine, req, kind))
    if TRACE:
        log.info("trace %s arrival=%.4f parsed=%.4f", rid, time.time() - (loop_now() - arrival), time.time())
    engine.in_flight += 1
    req["rank"].in_flight += 1
    engine.idle.clear()
    task = asyncio.current_task()
    engine.handlers.add(task)
    try:
        if body.get("stream"):
            return await _stream(request, engine, req, kind, body)
        return await _full(engine, req, kind)
    finally:
        engine.handlers.discard(task)
        engine.in_flight -= 1
        req["rank"].in_flight -= 1
        if engine.in_flight == 0:
            engine.idle.set()
        engine.finished_one(req["rank"])


async def _full(engine: Engine, req: dict, kind: str) -> web.Response:
    reasoning, content, n = [], [], 0
    try:
        async for _, burst in (engine.run(req) if req["pieces"] else _nothing()):
            for text, is_reasoning in burst:
                (reasoning if is_reasoning else content).append(text)
            n += len(burst)
    except RequestFailed as exc:
        return error_response(exc.status, exc.err_type, exc.message)
    created = int(time.time())
    usage = usage_of(req, n, engine)
    kvp = engine.kv_params_out(req) if req["finish"] != "abort" else None  # vLLM: an aborted request hands over no KV
    if kind == "chat":
        message = {"role": "assistant", "content": "".join(content), "refusal": None, "annotations": None,
                   "audio": None, "function_call": None, "tool_calls": [],
                   "reasoning": "".join(reasoning) or None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": req["finish"],
                  "stop_reason": None, "token_ids": None}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": "".join(reasoning) + "".join(content), "logprobs": None,
                  "finish_reason": req["finish"], "stop_reason": None, "token_ids": None,
                  "prompt_logprobs": None, "prompt_token_ids": None}
        obj = "text_completion"
    return web.json_response({"id": req["id"], "object": obj, "created": created, "model": engine.model_name,
                              "choices": [choice], "service_tier": None, "system_fingerprint": None,
                              "usage": usage, "prompt_logprobs": None, "prompt_token_ids": None,
                              "kv_transfer_params": kvp})


async def _stream(request: web.Request, engine: Engine, req: dict, kind: str, body: dict):
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    opts = body.get("stream_options") or {}
    include_usage = bool(opts.get("include_usage")) or engine.args.enable_force_include_usage
    continuous = include_usage and bool(opts.get("continuous_usage_stats"))
    created = int(time.time())
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    head = {"id": req["id"], "object": obj, "created": created, "model": engine.model_name}
    n = 0

    async def send(payload: dict) -> None:
        await resp.write(b"data: " + json.dumps(payload, separators=(", ", ": ")).encode() + b"\n\n")

    try:
        if not req["pieces"]:  # aborted before any token: one closing chunk, as vLLM sends
            if kind == "chat":
                await send({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                 "logprobs": None, "finish_reason": None}], "prompt_token_ids": None})
                choice = {"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": req["finish"],
                          "stop_reason": None, "token_ids": None}
            else:
                choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": req["finish"], "stop_reason": None}
            await send({**head, "choices": [choice]})
        async for _, burst in (engine.run(req) if req["pieces"] else _nothing()):
            if n == 0 and kind == "chat":
                first = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                              "logprobs": None, "finish_reason": None}],
                         "prompt_token_ids": None}
                if continuous:
                    first["usage"] = usage_of(req, 0, engine)
                await send(first)
            n += len(burst)
            last = n == len(req["pieces"])
            finish = req["finish"] if last else None
            if kind == "chat":
                delta = {}
                r = "".join(t for t, is_r in burst if is_r)
                c = "".join(t for t, is_r in burst if not is_r)
                if r:
                    delta["reasoning"] = r
                if c or not r:
                    delta["content"] = c
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": "".join(t for t, _ in burst), "logprobs": None,
                          "finish_reason": finish, "stop_reason": None}
            if last:
                choice["stop_reason"] = None
                if kind == "chat":
                    choice["token_ids"] = None
            chunk = {**head, "choices": [choice]}
            if continuous:
                chunk["usage"] = usage_of(req, n, engine)
            kvp = engine.kv_params_out(req) if last else None
            if kvp:
                chunk["kv_transfer_params"] = kvp
            await send(chunk)
        if include_usage:
            usage = usage_of(req, n, engine)
            if usage["prompt_tokens_details"] is None:
                del usage["prompt_tokens_details"]
            await send({**head, "choices": [], "usage": usage})
    except RequestFailed as exc:
        await send(error_body(exc.status, exc.err_type, exc.message))
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _nothing():
    return
    yield


async def handle_invocations(request):
    """vLLM's SageMaker route (always attached, no key): the body's type picks the endpoint."""
    try:
        body = await request.json()
    except (json.JSONDecodeError, ValueError) as exc:
        return error_response(400, "Bad Request", f"JSON decode error: {exc}")
    if isinstance(body, dict) and "messages" in body:
        return await handle_generate(request, "chat")
    if isinstance(body, dict) and "prompt" in body:
        return await handle_generate(request, "completion")
    return error_response(400, "BadRequestError", "Cannot find suitable handler for request. Expected one of: "
                          "['ChatCompletionRequest', 'CompletionRequest']")


async def handle_scale_elastic_ep(request):
    """vLLM's POST /scale_elastic_ep (attached for every generating model, no key): its checks of the body;
    the stand-in runs without elastic EP, so only the current size 'succeeds' (vLLM skips that scale)."""
    engine: Engine = request.app["engine"]
    try:
        body = await request.json()
    except (json.JSONDecodeError, ValueError):
        return error_response(400, "Bad Request", "Invalid JSON format")
    size = body.get("new_data_parallel_size") if isinstance(body, dict) else None
    drain = body.get("drain_timeout", 120) if isinstance(body, dict) else 120
    if size is None:
        return error_response(400, "Bad Request", "new_data_parallel_size is required")
    if not isinstance(size, int) or size <= 0:
        return error_response(400, "Bad Request", "new_data_parallel_size must be a positive integer")
    if not isinstance(drain, int) or drain <= 0:
        return error_response(400, "Bad Request", "drain_timeout must be a positive integer")
    if size != engine.args.data_parallel_size:
        return error_response(500, "Internal Server Error", "Scale failed")
    return web.json_response({"message": f"Scaled to {size} data parallel engines"})


async def handle_models(request):
    engine: Engine = request.app["engine"]
    created = int(engine.metrics.start_time)
    card = {"id": engine.model_name, "object": "model", "created": created, "owned_by": "vllm",
            "root": engine.args.model, "parent": None, "max_model_len": engine.max_model_len,
            "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                            "created": created, "allow_create_engine": False, "allow_sampling": True,
                            "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                            "allow_fine_tuning": False, "organization": "*", "group": None,
                            "is_blocking": False}]}
    return web.json_response({"object": "list", "data": [card]})


async def handle_tokenize(request):
    engine: Engine = request.app["engine"]
    try:
        body = await request.json()
        if "messages" in body:
            prompt, _ = engine.render_chat(body)
            ids = await engine.count_tokens(prompt)
        else:
            prompt = body.get("prompt", "")
            ids = prompt if isinstance(prompt, list) else await engine.count_tokens(prompt)
    except RequestFailed as exc:
        return error_response(exc.status, exc.err_type, exc.message)
    except (json.JSONDecodeError, AttributeError) as exc:
        return error_response(400, "BadRequestError", str(exc))
    return web.json_response({"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids,
                              "token_strs": None})


async def handle_render(request):
    engine: Engine = request.app["engine"]
    t_start = loop_now()
    try:
        body = await request.json()
        if request.path.startswith("/v1/chat"):
            prompt, _ = engine.render_chat(body)
            ids = await engine.count_tokens(prompt)
        else:
            prompt = body.get("prompt", "")
            ids = prompt if isinstance(prompt, list) else await engine.count_tokens(prompt)
    except RequestFailed as exc:
        return error_response(exc.status, exc.err_type, exc.message)
    except (json.JSONDecodeError, AttributeError) as exc:
        return error_response(400, "BadRequestError", str(exc))
    out = {"request_id": uuid.uuid4().hex, "token_ids": ids or [0]}
    if TRACE:
        log.info("trace render %.1f ms", 1000 * (loop_now() - t_start))
    return web.json_response(out if request.path.startswith("/v1/chat") else [out])


async def handle_health(request):
    return web.Response(status=503 if request.app["engine"].dead else 200)


async def handle_version(request):
    return web.json_response({"version": request.app["engine"].release["vllm_version"]})


async def handle_load(request):
    return web.json_response({"server_load": request.app["engine"].in_flight})


async def handle_metrics(request):
    engine: Engine = request.app["engine"]
    engine._gauges()
    return web.Response(text=engine.metrics.render(), content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type-Options": "nosniff"})


def build_app(engine: Engine) -> web.Application:
    api_key = engine.args.api_key or os.environ.get("VLLM_API_KEY")

    @web.middleware
    async def auth(request, handler):
        if api_key and request.method != "OPTIONS" and request.path.startswith(GUARDED_PREFIX) and \
                request.headers.get("Authorization") != f"Bearer {api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    app = web.Application(middlewares=[auth], client_max_size=256 * 1024 * 1024)
    app["engine"] = engine
    app.router.add_post("/v1/chat/completions", lambda r: handle_generate(r, "chat"))
    app.router.add_post("/v1/completions", lambda r: handle_generate(r, "completion"))
    app.router.add_post("/v1/chat/completions/render", handle_render)
    app.router.add_post("/v1/completions/render", handle_render)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_post("/tokenize", handle_tokenize)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/ping", handle_health)
    app.router.add_post("/ping", handle_health)
    app.router.add_get("/version", handle_version)
    app.router.add_get("/load", handle_load)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_post("/invocations", handle_invocations)
    app.router.add_post("/scale_elastic_ep", handle_scale_elastic_ep)
    return app


async def serve(engine: Engine) -> int:
    """Run until SIGTERM/SIGINT; drain for --shutdown-timeout seconds; return the exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    slow = float(engine.faults.get("slow_start_s") or 0)
    if slow > 0:  # vLLM binds its port but only listens once the engine is up: connection refused
        log.info("fault injection: slow_start_s=%s (loading)", slow)
        try:
            await asyncio.wait_for(stop.wait(), slow)
            return 0
        except asyncio.TimeoutError:
            pass
    side_servers = []
    if engine.role == "kv_producer" and not engine.faults.get("refuse_side_channel"):
        for i in range(engine.dp):
            port = engine.side_port + engine.dp_start + i
            side_servers.append(await kv.serve_side_channel(engine.side_host, port, engine.leases, engine.compat,
                                                            engine.release))
            log.info("NIXL side channel (DP rank %d) listening on %s:%d", i, engine.side_host, port)
    runner = web.AppRunner(build_app(engine), access_log=None, handle_signals=False,
                           shutdown_timeout=1.0)
    await runner.setup()
    host = engine.args.host or "0.0.0.0"
    site = web.TCPSite(runner, host, engine.args.port, reuse_address=True)
    await site.start()
    tasks = [asyncio.create_task(engine.reaper()), asyncio.create_task(engine.leaker())]
    cores = await start_engine_cores(engine, stop)
    log.info("Starting vLLM API server (lab stand-in) on http://%s:%d", host, engine.args.port)
    await stop.wait()
    if engine.dead:
        await stop_engine_cores(cores)
        for t in tasks:
            t.cancel()
        for s in side_servers:
            s.close()
        await runner.cleanup()
        return 1
    timeout = engine.args.shutdown_timeout
    log.info("[shutdown] mode=%s timeout=%ss in_flight=%d", "drain" if timeout else "abort", timeout,
             engine.in_flight)
    engine.draining = True
    if timeout > 0:
        try:
            await asyncio.wait_for(engine.idle.wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("[shutdown] drain timed out with %d requests in flight", engine.in_flight)
    await stop_engine_cores(cores)
    for t in tasks:
        t.cancel()
    for s in side_servers:
        s.close()
    await runner.cleanup()
    return 1 if engine.dead else 0


async def start_engine_cores(engine: Engine, stop: asyncio.Event) -> list:
    """One engine-core process per local DP rank, each watched: one that exits unasked aborts
    every request in flight and stops the server (vLLM: EngineDeadError)."""
    cores = []
    for rank in range(engine.dp):
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", ENGINE_CORE,
                                                    "EngineCore_DP%d" % (engine.dp_start + rank),
                                                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        cores.append(proc)
        engine.cores.append(proc)
        proc.pdctl_requested = asyncio.create_task(core_shutdown_requested(engine, proc, engine.ranks[rank]))

        async def watch(proc=proc, rank=rank):
            rc = await proc.wait()
            if rc == 0 and engine.ranks[rank].stopping and not engine.draining:
                # systemd signals every process of a unit at once: the API server's own SIGTERM may be
                # handled a moment after its core finished its drain.
                await asyncio.sleep(1.0)
            # Stopped by its API server, or (while the server itself drains) done with its own drain.
            if getattr(proc, "pdctl_stopping", False) or (rc == 0 and engine.draining and not engine.dead):
                return
            log.error("EngineCore_DP%d (pid %d) died unexpectedly (rc %s): aborting %d requests in flight",
                      engine.dp_start + rank, proc.pid, rc, engine.in_flight)
            engine.dead = True
            engine.draining = True
            for handler in list(engine.handlers):
                handler.cancel()
            stop.set()

        proc.pdctl_watch = asyncio.create_task(watch())
    log.info("engine cores: %s", ", ".join(str(p.pid) for p in cores))
    return cores


async def core_shutdown_requested(engine: Engine, proc, rank: Rank) -> None:
    """vLLM's EngineCore on SIGTERM/SIGINT: shutdown requested. Its rank takes no new work (aborted), finishes
    what it has (for --shutdown-timeout 0: nothing, the core goes at once), then the core exits."""
    line = await proc.stdout.readline()
    if not line:
        return
    log.info("[shutdown] EngineCore_DP%d: %s; %s %d in-flight requests", engine.dp_start + rank.index,
             line.decode().strip(), "draining" if engine.args.shutdown_timeout else "aborting", rank.in_flight)
    rank.stopping = True
    while engine.args.shutdown_timeout and rank.in_flight:
        await asyncio.sleep(0.05)
    if proc.returncode is None:
        proc.stdin.close()  # the core's busy loop ends: it exits 0


async def stop_engine_cores(cores) -> None:
    """What vLLM's API server does after its drain: stop its own engine cores."""
    for proc in cores:
        proc.pdctl_stopping = True
        if proc.returncode is None:
            proc.stdin.close()
    for proc in cores:
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) != 0
