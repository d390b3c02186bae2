"""Parse `serve MODEL FLAGS...` with the installed vLLM's own CLI parser, then exit.

Run with the release venv's python before a release goes live: an unknown, renamed or removed
flag exits 2 with vLLM's own argparse message, while the running release keeps serving.
"""
import sys

try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # older releases keep it in vllm.utils
    from vllm.utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import ServeSubcommand

parser = FlexibleArgumentParser(prog="vllm")
subparsers = parser.add_subparsers(dest="subparser", required=True)
serve = ServeSubcommand()
serve.subparser_init(subparsers)
args = parser.parse_args(sys.argv[1:])
serve.validate(args)
print("ok: %d arguments accepted by vLLM's parser" % (len(sys.argv) - 1))
