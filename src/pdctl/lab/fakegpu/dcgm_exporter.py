#!/usr/bin/python3
"""Lab stand-in for NVIDIA's `dcgm-exporter` on hosts without GPUs: serves /metrics with one series per
emulated GPU for every field of the counters file it is given (`-f/--collectors`, as the real exporter),
on `-a/--address` ([HOST]:PORT, default :9400). Values come from the host's hardware profile and its
faults (docs/hardware-profile.md), read at every scrape, so a fault written by a test shows at once:

  ecc_errors    [{gpu, volatile_uncorrected, volatile_corrected}] -> DCGM_FI_DEV_ECC_{DBE,SBE}_VOL_TOTAL
  nvlink_errors [{gpu, link, crc, crc_data, replay, recovery}]    -> DCGM_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL (sum over links)
  xid           [{gpu, xid}]                                      -> DCGM_FI_DEV_XID_ERRORS

Series look like the real exporter's: the field name as the metric name, labels gpu, UUID, pci_bus_id,
device, modelName, Hostname. A field the stand-in has no value for is served as 0; a name that is not a
DCGM field (no DCGM_FI_ prefix) is refused at start, as the real exporter refuses an unknown field.

Standard library only: installed as /usr/bin/dcgm-exporter by the lab's datacenter-gpu-manager-exporter
package (src/pdctl/lab/standin_debs.py), beside the GPU emulator module (pdctl_fakegpu).
"""
from __future__ import annotations

import argparse
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

try:  # on a lab host: the module the nvidia-smi stand-in installs
    from pdctl_fakegpu import Machine, load_profile
except ImportError:  # a checkout (tests)
    from pdctl.lab.fakegpu.nvidia_smi import Machine, load_profile

TYPES = ("gauge", "counter")
NVLINK = {"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "crc",
          "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "crc_data",
          "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "replay",
          "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "recovery"}


def read_counters(text):
    """[(field, type, help)] of a counters file; ValueError naming the line that is not one."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) != 3 or not parts[0].startswith("DCGM_FI_") or parts[1] not in TYPES:
            raise ValueError("line %d is not 'DCGM_FI_<field>, gauge|counter, help': %r" % (number, line))
        out.append(tuple(parts))
    return out


def _value(field, gpu, profile, xids):
    if field == "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL":
        return gpu["ecc"].get("volatile_uncorrected", 0)
    if field == "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL":
        return gpu["ecc"].get("volatile_corrected", 0)
    if field in NVLINK:
        return sum(int(err.get(NVLINK[field], 0)) for err in gpu["nvl_errors"].values())
    if field == "DCGM_FI_DEV_XID_ERRORS":
        return xids.get(gpu["slot"], 0)
    if field == "DCGM_FI_DEV_FB_FREE":
        return profile["gpu"].get("memory_mib", 0)
    if field == "DCGM_FI_DEV_GPU_TEMP":
        return 35
    return 0


def exposition(counters, profile=None, hostname=None):
    """The /metrics text for these counters on the profile's GPUs."""
    profile = profile or load_profile()
    machine = Machine(profile)
    hostname = hostname or socket.gethostname()
    faults = profile.get("faults") or {}
    xids = {int(x["gpu"]): int(x["xid"]) for x in faults.get("xid") or []}
    lines = []
    for field, kind, help_text in counters:
        lines.append("# HELP %s %s" % (field, help_text))
        lines.append("# TYPE %s %s" % (field, kind))
        for gpu in machine.gpus:
            labels = 'gpu="%d",UUID="%s",pci_bus_id="%s",device="nvidia%d",modelName="%s",Hostname="%s"' % (
                gpu["index"], gpu["uuid"], gpu["bus_id"], gpu["index"], gpu["name"], hostname)
            lines.append("%s{%s} %s" % (field, labels, _value(field, gpu, profile, xids)))
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="dcgm-exporter", description="pdctl-lab stand-in for dcgm-exporter")
    parser.add_argument("-f", "--collectors", default="/etc/dcgm-exporter/default-counters.csv")
    parser.add_argument("-a", "--address", default=":9400")
    args = parser.parse_args(argv)
    try:
        with open(args.collectors, encoding="utf-8") as handle:
            counters = read_counters(handle.read())
    except (OSError, ValueError) as exc:
        print("dcgm-exporter (pdctl-lab stand-in): %s: %s" % (args.collectors, exc), file=sys.stderr)
        return 1
    host, _, port = args.address.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = exposition(counters).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((host.strip("[]") or "", int(port)), Handler)
    print("dcgm-exporter (pdctl-lab stand-in) serving %d fields on %s" % (len(counters), args.address), flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
