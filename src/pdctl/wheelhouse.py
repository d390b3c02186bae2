"""Stage the Python packages the hosts install into the artifact store's wheels/ directory.

Hosts run `pip install --no-index --find-links <store>/wheels/`, so everything they need, with
dependencies, must be here as wheels built for the hosts' Python and platform.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def download(requirements: list[str], dest: Path, python_version: str | None = None,
             platforms: tuple[str, ...] = (), no_deps: bool = False) -> None:
    """pip download the requirements (with dependencies) as wheels for the target interpreter."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(dest),
           "--find-links", str(dest)]
    if no_deps:
        cmd.append("--no-deps")
    if python_version:
        cmd += ["--python-version", python_version]
    for platform in platforms:
        cmd += ["--platform", platform]
    res = subprocess.run(cmd + list(requirements), capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError("pip download %s failed: %s" % (" ".join(requirements), res.stderr.strip()[-2000:]))
