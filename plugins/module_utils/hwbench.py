"""GPU peer-to-peer copy bandwidth, every ordered GPU pair, with torch.

Runs as a script under the serving venv's interpreter (where torch lives), not under Ansible's:
nvlink_check writes this file out and runs it. Prints one JSON line. Standard library + torch.
"""
from __future__ import annotations

import json
import sys
import time


def measure(size_mb=256, iterations=5):
    import torch

    count = torch.cuda.device_count()
    nbytes = size_mb << 20
    result = {"device_count": count, "size_mb": size_mb, "devices": [], "pairs": []}
    buffers = []
    for i in range(count):
        result["devices"].append(torch.cuda.get_device_name(i))
        buffers.append(torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{i}"))

    def timed_copy(dst, src):
        dst.copy_(src, non_blocking=True)  # warm-up (peer mappings, clocks)
        torch.cuda.synchronize(dst.device)
        torch.cuda.synchronize(src.device)
        start = time.perf_counter()
        for dummy in range(iterations):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(dst.device)
        torch.cuda.synchronize(src.device)
        return nbytes * iterations / (time.perf_counter() - start) / 1e9

    for i in range(count):
        for j in range(count):
            if i == j:
                continue
            result["pairs"].append({"src": i, "dst": j, "peer_access": torch.cuda.can_device_access_peer(j, i),
                                    "gbps": round(timed_copy(buffers[j], buffers[i]), 1)})
    # Device-local copy as the reference figure on any machine, a 1-GPU box included.
    if count:
        scratch = torch.empty_like(buffers[0])
        result["local_copy_gbps"] = round(timed_copy(scratch, buffers[0]), 1)
    return result


if __name__ == "__main__":
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    sys.stdout.write("PDCTL_HWBENCH " + json.dumps(measure(size)) + "\n")
