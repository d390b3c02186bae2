"""`pdctl-lab up|down|status`: the three local test hosts. The lab is the bench, not the product: it has an
entry point of its own (pyproject.toml's `pdctl-lab`), and the `pdctl` command never imports it."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser(prog: str = "pdctl-lab") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="the three local test hosts (podman)")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("-i", "--inventory", type=Path, default=None,
                   help="hosts to manage (default inventories/lab; molecule passes its own)")
    return p


def main(argv=None, prog: str = "pdctl-lab") -> int:
    from pdctl.lab import hosts

    args = build_parser(prog).parse_args(argv)
    if args.action == "status":
        print("== lab hosts")
    return {"up": hosts.up, "down": hosts.down, "status": hosts.status}[args.action](args.inventory)


if __name__ == "__main__":
    sys.exit(main())
