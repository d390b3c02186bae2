"""Console entry point: ``pdctl-lab-engine [serve] MODEL [vllm serve options]``
(until the script is registered: ``python -m pdctl.lab.engine ...``)."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path

from pdctl.lab.engine import args as engine_args
from pdctl.lab.engine import profile as engine_profile

log = logging.getLogger("pdctl.lab.engine")


def _visible_gpus() -> list[str] | None:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [d for d in value.split(",") if d.strip()]


def load_model_dir(model: str, tokenizer_dir: str | None):
    """Load tokenizer.json (+ chat template, max length) from the served model directory."""
    from tokenizers import Tokenizer

    from pdctl.lab.tokenizer import CHAT_TEMPLATE, MAX_MODEL_LEN

    root = Path(tokenizer_dir or model)
    if not (root / "tokenizer.json").exists():
        raise SystemExit(f"ERROR: no tokenizer.json in {root} (build one with pdctl.lab.tokenizer.build)")
    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    cfg_path = root / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    max_len = int(cfg.get("model_max_length", MAX_MODEL_LEN))
    model_cfg = root / "config.json"
    if model_cfg.exists():
        max_len = int(json.loads(model_cfg.read_text()).get("max_position_embeddings", max_len))
    return tok, cfg.get("chat_template") or CHAT_TEMPLATE, max_len


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s [lab-engine] %(message)s")
    args = engine_args.parse(sys.argv[1:] if argv is None else argv)
    profile = engine_profile.load()
    gpus = _visible_gpus()
    dp_local = args.data_parallel_size_local or args.data_parallel_size
    need = dp_local * args.tensor_parallel_size * args.pipeline_parallel_size
    if gpus is not None and len(gpus) < need:
        log.error("CUDA_VISIBLE_DEVICES=%s has %d devices, but DP %d x TP %d x PP %d needs %d",
                  os.environ["CUDA_VISIBLE_DEVICES"], len(gpus), dp_local, args.tensor_parallel_size,
                  args.pipeline_parallel_size, need)
        return 1
    tokenizer, template, max_len = load_model_dir(args.model, args.tokenizer)
    if args.max_model_len:
        max_len = int(str(args.max_model_len).lower().replace("k", "000"))
    from pdctl.lab.engine import RELEASE

    log.info("stand-in release %s (%s), impersonating vLLM %s", RELEASE["name"], RELEASE["version"],
             RELEASE["vllm_version"])
    log.info("model=%s served_model_name=%s kv_role=%s dp=%d tp=%d spec_tokens=%d gpus=%s "
             "VLLM_USE_V2_MODEL_RUNNER=%s side_channel=%s:%s",
             args.model, args.served_model_name, engine_args.kv_role(args), dp_local,
             args.tensor_parallel_size, engine_args.num_speculative_tokens(args),
             ",".join(gpus) if gpus is not None else "(unset)", os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "0"),
             os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"),
             os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600"))
    from pdctl.lab.engine.server import Engine, serve

    async def run() -> int:
        engine = Engine(args, profile, tokenizer, template, max_len)
        return await serve(engine)

    return asyncio.run(run())


if __name__ == "__main__":
    raise SystemExit(main())
