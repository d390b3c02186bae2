"""`vllm serve MODEL ...` argv, parsed the way vLLM 0.33's argparse does.

Only a curated subset of vLLM's ~300 options is known here: every flag of the recipe's two
commands, what the deployment adds per instance, and the common ones around them. Anything else
is rejected like vLLM rejects an unknown option: exit code 2 and
``vllm serve: error: unrecognized arguments: ...`` on stderr.
Like vLLM's FlexibleArgumentParser, ``--flag_name`` is accepted as ``--flag-name`` and
JSON-valued configs are parsed as JSON.
"""
from __future__ import annotations

import argparse
import json
import re
import sys

BOOL = "bool"
JSON = "json"

# (long name, short alias or None, kind or python type, default)
OPTIONS: list[tuple[str, str | None, object, object]] = [
    # the recipe
    ("--trust-remote-code", None, BOOL, False),
    ("--kv-transfer-config", None, JSON, None),
    ("--chat-template-content-format", None, str, "auto"),
    ("--enable-expert-parallel", "-ep", BOOL, False),
    ("--tensor-parallel-size", "-tp", int, 1),
    ("--data-parallel-size", "-dp", int, 1),
    ("--tool-call-parser", None, str, None),
    ("--enable-auto-tool-choice", None, BOOL, False),
    ("--reasoning-parser", None, str, ""),
    ("--gpu-memory-utilization", None, float, 0.92),
    ("--enable-prompt-tokens-details", None, BOOL, False),
    ("--speculative-config", None, JSON, None),
    ("--shutdown-timeout", None, int, 0),
    ("--fingerprint-mode", None, str, "none"),
    ("--compilation-config", "-cc", JSON, None),
    ("--max-num-batched-tokens", None, int, None),
    ("--all2all-backend", None, str, None),
    # what the deployment adds per instance
    ("--host", None, str, None),
    ("--port", None, int, 8000),
    ("--served-model-name", None, str, None),
    ("--api-key", None, str, None),
    ("--data-parallel-rpc-port", "-dpp", int, None),
    ("--data-parallel-size-local", "-dpl", int, None),
    ("--data-parallel-address", "-dpa", str, None),
    ("--data-parallel-start-rank", "-dpr", int, None),
    ("--data-parallel-rank", "-dpn", int, None),
    ("--data-parallel-backend", "-dpb", str, "mp"),
    # common neighbours
    ("--pipeline-parallel-size", "-pp", int, 1),
    ("--max-model-len", None, str, None),
    ("--max-num-seqs", None, int, None),
    ("--block-size", None, int, None),
    ("--kv-cache-dtype", None, str, "auto"),
    ("--dtype", None, str, "auto"),
    ("--quantization", "-q", str, None),
    ("--seed", None, int, 0),
    ("--tokenizer", None, str, None),
    ("--tokenizer-mode", None, str, "auto"),
    ("--revision", None, str, None),
    ("--download-dir", None, str, None),
    ("--load-format", None, str, "auto"),
    ("--enforce-eager", None, BOOL, False),
    ("--enable-prefix-caching", None, BOOL, None),
    ("--enable-chunked-prefill", None, BOOL, None),
    ("--async-scheduling", None, BOOL, None),
    ("--chat-template", None, str, None),
    ("--generation-config", None, str, "auto"),
    ("--override-generation-config", None, JSON, None),
    ("--hf-overrides", None, JSON, None),
    ("--max-log-len", None, int, None),
    ("--uvicorn-log-level", None, str, "info"),
    ("--disable-uvicorn-access-log", None, BOOL, False),
    ("--disable-log-stats", None, BOOL, False),
    ("--enable-log-requests", None, BOOL, False),
    ("--enable-request-id-headers", None, BOOL, False),
    ("--enable-force-include-usage", None, BOOL, False),
    ("--enable-server-load-tracking", None, BOOL, False),
    ("--enable-eplb", None, BOOL, False),
    ("--eplb-config", None, JSON, None),
    ("--kv-events-config", None, JSON, None),
    ("--attention-config", "-ac", JSON, None),
    ("--optimization-level", "-O", str, None),
    ("--root-path", None, str, None),
    ("--middleware", None, str, None),
    ("--allowed-origins", None, JSON, None),
    ("--ssl-keyfile", None, str, None),
    ("--ssl-certfile", None, str, None),
    ("--uds", None, str, None),
    ("--headless", None, BOOL, False),
    ("--api-server-count", "-asc", int, None),
    ("--config", None, str, None),
]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # same wording and exit code as argparse in `vllm serve`
        if message.startswith("unrecognized arguments:") and re.search(r"(^|\s)--task(=|\s|$)", message):
            message += ("\n\nHint: --task is not a vllm serve option. For embedding, reranking, or reward "
                        "models, use --runner pooling. To adapt a generative model for pooling, also use "
                        "--convert embed, --convert classify, or --convert reward.")
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _json_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON {text!r}: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vllm serve", usage="vllm serve [model_tag] [options]", add_help=True,
                     allow_abbrev=False)
    parser.add_argument("model_tag", nargs="?", default=None, help="model directory or name")
    parser.add_argument("--model", dest="model", default=None)
    for name, short, kind, default in OPTIONS:
        flags = [name] + ([short] if short else [])
        if kind is BOOL:
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, default=default)
        elif kind is JSON:
            parser.add_argument(*flags, type=_json_value, default=default)
        else:
            parser.add_argument(*flags, type=kind, default=default)
    return parser


def _normalise(argv: list[str]) -> list[str]:
    """--max_num_seqs -> --max-num-seqs (also in --flag=value), as FlexibleArgumentParser does."""
    out = []
    for arg in argv:
        if arg.startswith("--") and "_" in arg.split("=", 1)[0]:
            key, sep, value = arg.partition("=")
            arg = key.replace("_", "-") + sep + value
        out.append(arg)
    return out


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse `[serve] MODEL [options]`; exits 2 on unknown or malformed options."""
    argv = list(argv)
    if argv and argv[0] == "serve":
        argv = argv[1:]
    parser = build_parser()
    args = parser.parse_args(_normalise(argv))
    args.model = args.model_tag or args.model
    if not args.model:
        parser.error("the following arguments are required: model_tag")
    if args.served_model_name is None:
        args.served_model_name = args.model
    for name in ("kv_transfer_config", "speculative_config", "compilation_config"):
        value = getattr(args, name)
        if value is not None and not isinstance(value, dict):
            parser.error(f"argument --{name.replace('_', '-')}: expected a JSON object")
    if args.optimization_level is not None and not re.fullmatch(r"[0-3]", args.optimization_level):
        parser.error(f"argument -O/--optimization-level: invalid value {args.optimization_level!r}")
    return args


def kv_role(args) -> str | None:
    cfg = args.kv_transfer_config or {}
    return cfg.get("kv_role")


def num_speculative_tokens(args) -> int:
    cfg = args.speculative_config or {}
    return int(cfg.get("num_speculative_tokens", 0) or 0)
