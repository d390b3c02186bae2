"""`pdctl render -i INVENTORY --out DIR`: every unit and environment file, without touching a host.

Runs playbooks/render.yml with a local connection: the same templates and filters the roles use
on the hosts, written under DIR/<host>/. Secrets files are never rendered.
"""
from __future__ import annotations

import sys
from pathlib import Path

from pdctl import runner
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import topology


def main(args) -> int:
    from pdctl import inventory
    try:
        inventory.plan(args.inventory)
    except (inventory.InventoryError, topology.PlanError) as exc:
        print("pdctl render: %s is invalid: %s" % (args.inventory, exc), file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    result = runner.run_playbook("playbooks/render.yml", args.inventory, extravars={"render_dir": str(out)})
    if not result.ok:
        for failure in result.failures:
            print("pdctl render: %s: %s: %s" % (failure["host"], failure["task"], failure["msg"]), file=sys.stderr)
        return 1
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        print(path.relative_to(out))
    return 0


def add_parser(sub):
    p = sub.add_parser("render", help="write every unit and env file the inventory produces, offline")
    p.add_argument("-i", "--inventory", required=True)
    p.add_argument("--out", required=True, help="directory to write DIR/<host>/etc/... into")
    p.set_defaults(func=main)
