"""`pdctl lab up|down|status`."""
from __future__ import annotations

from pathlib import Path


def add_parser(sub):
    p = sub.add_parser("lab", help="the three local test hosts")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("-i", "--inventory", type=Path, default=None,
                   help="hosts to manage (default inventories/lab; molecule passes its own)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from pdctl.lab import hosts

    return {"up": hosts.up, "down": hosts.down, "status": hosts.status}[args.action](args.inventory)
