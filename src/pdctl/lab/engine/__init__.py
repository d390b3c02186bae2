"""Lab-only stand-in for the vLLM 0.33 engine (`vllm serve`): same argv, same HTTP protocol,
same metrics, a P/D KV hand-off over real TCP, and latencies taken from a profile file.
Never installed by the b300 inventory. See docs/engine-standin.md."""
VLLM_VERSION = "0.33.0"
