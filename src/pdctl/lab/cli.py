"""`pdctl-lab up|down|status|hardware`: the three local test hosts. The lab is the bench, not the product: it has
an entry point of its own (pyproject.toml's `pdctl-lab`), and the `pdctl` command never imports it."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser(prog: str = "pdctl-lab") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="the three local test hosts (podman)")
    p.add_argument("action", choices=["up", "down", "status", "hardware"],
                   help="hardware: write the hosts' emulated hardware (profile, faults, InfiniBand devices) from "
                        "the inventory again; `up` does it for the lab's own inventory")
    p.add_argument("-i", "--inventory", type=Path, default=None,
                   help="hosts to manage (default inventories/lab; molecule passes its own)")
    p.add_argument("--limit", default=None, help="hardware only: these hosts (an Ansible pattern)")
    p.add_argument("-e", "--extra-vars", action="append", default=[], metavar="K=V|@FILE",
                   help="hardware only: variables over the inventory's, as ansible-playbook takes them")
    return p


def hardware(inventory: Path | None, limit: str | None = None, extra_vars=()) -> int:
    """The emulated hardware on the inventory's serving hosts; 0 when every host has it."""
    from pdctl.lab import hardware as lab_hardware
    from pdctl.lab import hosts

    result = lab_hardware.apply(inventory or hosts.inventory_path(), limit=limit,
                                extra_args=[a for v in extra_vars for a in ("-e", v)])
    if not result.ok:
        print("pdctl-lab hardware: failed (artifacts %s)\n%s" % (result.artifact_dir, result.recap()), file=sys.stderr)
        for failure in result.failures:
            print("  %(host)s: %(task)s: %(msg)s" % dict({"msg": ""}, **failure), file=sys.stderr)
        return 1
    hosts.step("emulated hardware written (%d changed)" % result.total("changed"))
    return 0


def main(argv=None, prog: str = "pdctl-lab") -> int:
    from pdctl.lab import hosts

    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.action != "hardware" and (args.limit or args.extra_vars):
        parser.error("--limit and -e go with `hardware` only")
    if args.action == "status":
        print("== lab hosts")
    if args.action == "hardware":
        return hardware(args.inventory, args.limit, args.extra_vars)
    rc = {"up": hosts.up, "down": hosts.down, "status": hosts.status}[args.action](args.inventory)
    # The lab's hosts get their emulated hardware before anything reads it (site.yml's driver role). Another
    # inventory's host (molecule's) is no serving host: its scenarios apply role lab_hardware themselves.
    if args.action == "up" and rc == 0 and args.inventory is None:
        rc = hardware(None)
    return rc


if __name__ == "__main__":
    sys.exit(main())
