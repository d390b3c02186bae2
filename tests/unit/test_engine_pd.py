"""P/D hand-off of the engine stand-in: the producer's kv_transfer_params, leases, the KV pull,
answer keys and the lab tokenizer."""
import asyncio
import hashlib
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import answer_key
from pdctl.lab import tokenizer as lab_tokenizer
from pdctl.lab.engine import answers, args as engine_args, kv, profile as engine_profile
from pdctl.lab.engine.cli import load_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return lab_tokenizer.build(tmp_path_factory.mktemp("model"))


def make_engine(model_dir, argv, monkeypatch):
    from pdctl.lab.engine.server import Engine

    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "10.0.0.7")
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600")
    a = engine_args.parse([str(model_dir)] + argv)
    tok, template, max_len = load_model_dir(a.model, None)
    return Engine(a, engine_profile.load(""), tok, template, max_len)


def test_producer_kv_transfer_params(model_dir, monkeypatch):
    async def go():
        e = make_engine(model_dir, ["--kv-transfer-config",
                                    '{"kv_connector":"NixlConnector","kv_role":"kv_producer",'
                                    '"kv_connector_extra_config":{"kv_lease_duration":12}}', "-dp", "4"], monkeypatch)
        assert e.lease_s == 12
        req = {"id": "chatcmpl-abc", "prompt_tokens": 200, "kv_params": {"do_remote_decode": True},
               "rank": e.ranks[2]}
        p = e.kv_params_out(req)
        assert p["do_remote_prefill"] is True and p["do_remote_decode"] is False
        assert p["remote_host"] == "10.0.0.7" and p["remote_port"] == 5602  # base + DP rank
        assert p["remote_request_id"] == "chatcmpl-abc" and p["remote_engine_id"].endswith("_dp2")
        assert p["tp_size"] == 1 and len(p["remote_block_ids"]) == 1 and len(p["remote_block_ids"][0]) == 4
        assert e.leases.held["chatcmpl-abc"][1] == 200 * 1024  # kv_bytes_per_token default
        assert e.kv_params_out({**req, "kv_params": None}) is None  # not a prefill leg
    asyncio.run(go())


def test_lease_expiry_counts_on_producer():
    expired = []
    leases = kv.Leases(0.05, expired.append)
    leases.add("r1", 10, 3, "e")
    time.sleep(0.08)
    assert leases.take("r1", "e") is None and expired == [3]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_pull_real_bytes_and_failures():
    async def go():
        leases = kv.Leases(30, lambda r: None)
        leases.add("r1", 3_000_000, 0, "eng")
        port = _free_port()
        chan = await kv.serve_side_channel("127.0.0.1", port, leases, "compat")
        assert await kv.pull("127.0.0.1", port, "r1", "eng", "compat") == 3_000_000
        with pytest.raises(kv.KVPullError, match="unknown or expired"):
            await kv.pull("127.0.0.1", port, "r1", "eng", "compat")  # KV already taken
        leases.add("r2", 10, 0, "eng")
        with pytest.raises(kv.KVPullError, match="compatibility"):
            await kv.pull("127.0.0.1", port, "r2", "eng", "other-model")
        chan.close()
        with pytest.raises(kv.KVPullError, match="handshake"):
            await kv.pull("127.0.0.1", _free_port(), "r2", "eng", "compat")
    asyncio.run(go())


def _in_fresh_python(code: str, seed: str) -> str:
    """Run code in a new interpreter with another hash seed: what a second engine process would do."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=dict(os.environ, PYTHONHASHSEED=seed)).stdout


def test_answer_key_follows_the_documented_rule_in_every_process(tmp_path):
    prompts = [f"question {i}" for i in range(200)]
    entries = {answers.prompt_sha(p): {"correct": "ANSWER: A", "wrong": "ANSWER: B"} for p in prompts}
    path = tmp_path / "key.json"
    path.write_text(json.dumps({"correct_rate": 0.7, "entries": entries}))
    key = answers.AnswerKey(str(path))
    got = [key.answer(p)[1] for p in prompts]
    # Worked by hand from sha256("question i")[:8] / 2**32: 0.381, 0.099, 0.748, 0.979, 0.400, 0.597, 0.868, 0.937.
    assert got[:8] == ["ANSWER: A", "ANSWER: A", "ANSWER: B", "ANSWER: B", "ANSWER: A", "ANSWER: A", "ANSWER: B",
                       "ANSWER: B"]
    for p, g in zip(prompts, got):  # the rule the gate uses to predict the stand-in (answer_key.predicted_correct)
        assert (g == "ANSWER: A") == answer_key.predicted_correct(hashlib.sha256(p.encode()).hexdigest(), 0.7)
    assert 0.55 < got.count("ANSWER: A") / 200 < 0.85
    other = _in_fresh_python("import json; from pdctl.lab.engine import answers; k = answers.AnswerKey(%r); "
                             "print(json.dumps([k.answer('question %%d' %% i)[1] for i in range(200)]))" % str(path),
                             seed="12345")
    assert json.loads(other) == got
    assert answers.AnswerKey(str(path), correct_rate=0.0).answer(prompts[0])[1] == "ANSWER: B"
    assert key.answer("not in the key") is None
    assert "ANSWER" not in answers.AnswerKey(str(path), mode="unparsable").answer(prompts[0])[1]


def test_tokenizer_build_is_deterministic_and_exact(tmp_path, model_dir):
    """Built again in another process with another hash seed (set and dict order must not leak in)."""
    _in_fresh_python("from pdctl.lab import tokenizer; tokenizer.build(%r)" % str(tmp_path / "again"), seed="4242")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (model_dir / name).read_bytes()
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["model_type"] == "glm_moe_dsa" and cfg["architectures"] == ["GlmMoeDsaForCausalLM"]
    tok, _, _ = load_model_dir(str(model_dir), None)
    pieces = answers.lorem_pieces(300, "seed")
    assert len(tok.encode("".join(pieces), add_special_tokens=False).ids) == 300
    text = "Let me think. Therefore the answer is \\boxed{42}.\nANSWER: C"
    assert "".join(answers.text_pieces(tok, text)) == text
