"""argv of the engine stand-in: the recipe's two commands parse; unknown flags fail like vLLM."""
import shlex

import pytest

from pdctl.lab.engine import args as engine_args

PREFILL = """/mnt/model/glm/GLM-5.2-NVFP4 --trust-remote-code
  --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'
  --chat-template-content-format=string -ep -tp 1 -dp 4
  --tool-call-parser glm47 --enable-auto-tool-choice --reasoning-parser glm45
  --gpu-memory-utilization 0.92 --enable-prompt-tokens-details
  --speculative-config='{"method":"mtp","num_speculative_tokens":1}'
  --shutdown-timeout 300 --fingerprint-mode=none"""
DECODE = """/mnt/model/glm/GLM-5.2-NVFP4 --trust-remote-code --chat-template-content-format=string
  --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'
  --compilation-config '{"cudagraph_mode":"FULL_DECODE_ONLY"}' --max-num-batched-tokens 1024
  -ep -tp 1 -dp 8 --tool-call-parser glm47 --enable-auto-tool-choice --reasoning-parser glm45
  --gpu-memory-utilization 0.90 --enable-prompt-tokens-details
  --all2all-backend=flashinfer_nvlink_two_sided
  --speculative-config='{"method":"mtp","num_speculative_tokens":3}'
  --shutdown-timeout 300 --fingerprint-mode=none"""
DEPLOY = "--host 0.0.0.0 --port 8100 --data-parallel-rpc-port 13345 --served-model-name glm-5.2"


def test_prefill_command():
    a = engine_args.parse(["serve"] + shlex.split(PREFILL) + shlex.split(DEPLOY))
    assert a.model == "/mnt/model/glm/GLM-5.2-NVFP4"
    assert engine_args.kv_role(a) == "kv_producer"
    assert (a.enable_expert_parallel, a.tensor_parallel_size, a.data_parallel_size) == (True, 1, 4)
    assert engine_args.num_speculative_tokens(a) == 1
    assert a.shutdown_timeout == 300 and a.fingerprint_mode == "none"
    assert a.chat_template_content_format == "string" and a.reasoning_parser == "glm45"
    assert (a.host, a.port, a.data_parallel_rpc_port, a.served_model_name) == ("0.0.0.0", 8100, 13345, "glm-5.2")


def test_decode_command():
    a = engine_args.parse(shlex.split(DECODE))
    assert engine_args.kv_role(a) == "kv_consumer"
    assert a.compilation_config == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    assert a.max_num_batched_tokens == 1024 and a.data_parallel_size == 8
    assert a.all2all_backend == "flashinfer_nvlink_two_sided"
    assert engine_args.num_speculative_tokens(a) == 3
    assert a.served_model_name == a.model


def test_underscore_and_negated_forms():
    a = engine_args.parse(["m", "--max_num_seqs=64", "--no-enable-prefix-caching", "-O3", "--api-key", "k"])
    assert a.max_num_seqs == 64 and a.enable_prefix_caching is False
    assert a.optimization_level == "3" and a.api_key == "k"


@pytest.mark.parametrize("argv,message", [
    (["m", "--bogus-flag", "1"], "unrecognized arguments: --bogus-flag 1"),
    (["m", "--task", "embed"], "unrecognized arguments: --task embed"),
    (["m", "-tp", "x"], "argument --tensor-parallel-size/-tp: invalid int value: 'x'"),
    (["m", "--kv-transfer-config", "{nope"], "argument --kv-transfer-config: invalid JSON"),
])
def test_rejected_like_vllm(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        engine_args.parse(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "vllm serve: error: " + message in err
    assert err.startswith("usage: vllm serve")
