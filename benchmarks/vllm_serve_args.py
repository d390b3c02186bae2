"""Run the production argument checker (roles/vllm/files/vllm_check_serve_args.py) against a real vLLM release.

    python benchmarks/vllm_serve_args.py --python /path/to/venv/bin/python

On demand, not in every CI run: the release venv is vllm 0.33.0 with torch 2.14.0 (CUDA build, about 9 GB
installed; it installs and imports on a CPU-only machine). Make it with
    python3 -m venv V && V/bin/pip install vllm==0.33.0
The lab's pre-switch check uses the stand-in's parser, so this is the only run of vLLM's own parser.
Without a GPU, vLLM 0.33 cannot infer a device type ("Failed to infer device type") while it builds the
parser's defaults; on a machine with no nvidia-smi this script sets VLLM_TARGET_DEVICE=cpu, which changes
vLLM's platform detection only (the flags and their parsing are the same code).

Checks, on the b300 inventory's rendered units (`pdctl render`: the recipe's flags plus what the plan adds):
  - every prefill and the decode ExecStart is accepted ("ok: N arguments accepted"),
  - an unknown flag and a bad value are rejected with exit 2 and vLLM's own argparse message.
Prints one line per case and exits 1 if any case went the other way.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pdctl import collection

ROOT = collection.root()
CHECKER = ROOT / "roles" / "vllm" / "files" / "vllm_check_serve_args.py"


def rendered_argvs() -> dict[str, list[str]]:
    """{instance: [serve, MODEL, flags...]} from the b300 inventory's rendered units."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pdctl.cli", "render", "-i", str(ROOT / "inventories" / "b300"),
                        "--out", tmp], check=True, stdout=subprocess.DEVNULL)
        for unit in sorted(Path(tmp).glob("*/etc/systemd/system/pdctl-vllm-*.service")):
            line = next(x for x in unit.read_text().splitlines() if x.startswith("ExecStart="))
            argv = shlex.split(line[len("ExecStart="):].replace("%%", "%"))
            out[unit.stem.replace("pdctl-vllm-", "")] = argv[1:]  # drop .../bin/vllm
    return out


def check(python: str, argv: list[str]) -> tuple[int, str, float]:
    env = dict(os.environ, VLLM_USE_V2_MODEL_RUNNER="1")
    if shutil.which("nvidia-smi") is None:
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    started = time.monotonic()
    res = subprocess.run([python, str(CHECKER), *argv], capture_output=True, text=True, env=env, timeout=600)
    return res.returncode, (res.stdout + res.stderr).strip(), time.monotonic() - started


def cases() -> list[tuple[str, list[str], int, str]]:
    """(name, argv, expected exit code, text the output must contain)."""
    argvs = rendered_argvs()
    decode = argvs["decode-0"]
    out = [(name, argv, 0, "arguments accepted by vLLM's parser") for name, argv in argvs.items()]
    out.append(("decode + unknown flag", decode + ["--no-such-flag"], 2, "unrecognized arguments: --no-such-flag"))
    bad_value = list(decode)
    bad_value[bad_value.index("--gpu-memory-utilization") + 1] = "most"
    out.append(("decode, bad value", bad_value, 2, "--gpu-memory-utilization"))
    bad_choice = [w if not w.startswith("--all2all-backend=") else "--all2all-backend=carrier_pigeon" for w in decode]
    out.append(("decode, bad choice", bad_choice, 2, "carrier_pigeon"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="python of a venv with the vLLM release installed")
    args = parser.parse_args()
    version = subprocess.run([args.python, "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"],
                             capture_output=True, text=True)
    print("release: vllm/torch %s%s" % (version.stdout.strip() or version.stderr.strip()[-300:],
                                         "" if shutil.which("nvidia-smi") else " (no GPU: VLLM_TARGET_DEVICE=cpu)"))
    wrong = 0
    for name, argv, want_rc, want_text in cases():
        rc, text, seconds = check(args.python, argv)
        last = next((x for x in text.splitlines() if want_text in x), text.splitlines()[-1] if text else "")
        ok = rc == want_rc and want_text in text
        wrong += not ok
        print("%-4s %-24s rc=%d (want %d) %5.1fs  %s" % ("ok" if ok else "FAIL", name, rc, want_rc, seconds, last[:200]))
        if not ok:
            print("      expected %r in:\n%s" % (want_text, text[-3000:]))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
