"""The `pdctl` command: operator-facing entry points. The lab (the test bench) is `pdctl-lab`, a command of its own."""
from __future__ import annotations

import argparse
import sys

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import topology
from pdctl import runner

EXIT_INVALID = 2  # the inventory (or other input) was rejected before anything changed


def _cmd_plan(args) -> int:
    from pdctl import inventory
    try:
        plan = inventory.plan(args.inventory)
    except inventory.InventoryError as exc:
        print("pdctl plan: %s" % exc, file=sys.stderr)
        return EXIT_INVALID
    except topology.PlanError as exc:
        print("pdctl plan: %s is invalid (%d problem%s):" % (args.inventory, len(exc.problems),
                                                           "" if len(exc.problems) == 1 else "s"), file=sys.stderr)
        for problem in exc.problems:
            print("  - %s" % problem, file=sys.stderr)
        return EXIT_INVALID
    print(topology.to_json(plan) if args.json else topology.format_table(plan))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdctl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="compute and validate the serving plan of an inventory")
    p.add_argument("-i", "--inventory", required=True)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_cmd_plan)

    from pdctl import render, report, run, stage
    from pdctl.gates import cli as gate_cli

    gate_cli.add_parser(sub)
    render.add_parser(sub)
    report.add_parser(sub)
    run.add_parser(sub)
    stage.add_parser(sub)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except runner.RunnerError as exc:
        print("pdctl %s: %s" % (args.command, exc), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
