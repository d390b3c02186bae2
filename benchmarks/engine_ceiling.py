"""Print the engine stand-in's ceiling on this machine: the concurrency (and request rate) up to
which the real `vllm-rs bench serve` still measures the profile's TPOT within 5%.

    .venv/bin/python benchmarks/engine_ceiling.py [--levels 32,64,128,256,512]
"""
import argparse
import tempfile
from pathlib import Path

from pdctl.lab import loopback as ce
from pdctl.lab import tokenizer, tools
from pdctl.lab.engine import profile as engine_profile

LATENCY = {"prefill_tokens_per_s": 200000, "prefill_overhead_ms": 20, "decode_step_ms": 30,
           "decode_step_ms_per_request": 0.0, "mtp_acceptance_rate": 0.8, "kv_bytes_per_token": 1024}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="32,64,128,256,512,1024")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    opts = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="engine-ceiling-"))
    model = tokenizer.build(work / "model")
    prof = ce.write_profile(work / "p.yaml", latency=LATENCY)
    p = engine_profile.load(str(prof))
    eng = ce.start_engine(model, ce.SINGLE_ARGS, prof, work, "engine")
    vllm_rs = tools.ensure_vllm_rs()
    print(f"profile: decode_step_ms={LATENCY['decode_step_ms']} MTP N=3 rate=0.8 "
          f"input={opts.input_len} output={opts.output_len}; one stand-in process (-dp 8)")
    print(f"{'conc':>5} {'req/s':>7} {'out tok/s':>9} {'TTFT ms':>8} {'exp':>6} {'TPOT ms':>8} {'exp':>6} {'err %':>6}")
    ceiling = None
    try:
        for c in (int(x) for x in opts.levels.split(",")):
            res = ce.bench(vllm_rs, eng.url, model, work, f"c{c}", backend="openai-chat", concurrency=c,
                           num_prompts=2 * c, input_len=opts.input_len, output_len=opts.output_len)
            exp_tpot = engine_profile.expected_tpot_s(p, c, 3) * 1000
            exp_ttft = engine_profile.expected_ttft_s(p, opts.input_len + 4) * 1000
            err = 100 * (res["mean_tpot_ms"] - exp_tpot) / exp_tpot
            print(f"{c:>5} {res['request_throughput']:>7.1f} {res['output_throughput']:>9.0f} "
                  f"{res['mean_ttft_ms']:>8.1f} {exp_ttft:>6.1f} {res['mean_tpot_ms']:>8.2f} {exp_tpot:>6.2f} "
                  f"{err:>6.1f}", flush=True)
            if res["failed"] or abs(err) > 5:
                break
            ceiling = (c, res["request_throughput"], res["output_throughput"])
    finally:
        eng.stop()
    if ceiling:
        print(f"ceiling: {ceiling[0]} concurrent streams, {ceiling[1]:.1f} requests/s, "
              f"{ceiling[2]:.0f} output tokens/s with TPOT within 5% of the profile")
    else:
        print("ceiling: below the lowest level tried")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
