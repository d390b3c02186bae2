"""Fetch the real client and router the lab tests run against.

- ``ensure_vllm_rs(cache_dir)``: the standalone Rust benchmark client shipped inside the
  vllm==0.33.0 wheel (``vllm/vllm-rs``). The wheel is downloaded once with
  ``pip download --no-deps`` and only that one member is extracted.
- ``ensure_vllm_router(cache_dir)``: a virtualenv holding vllm-router==0.1.17.

Both are idempotent: once the binary exists, nothing touches the network; one process at a time
fills an entry (a file lock in the cache), so concurrent callers do not download into each other.
"""
from __future__ import annotations

import contextlib
import fcntl
import stat
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

from pdctl import cache

VLLM_VERSION = "0.33.0"
VLLM_ROUTER_VERSION = "0.1.17"


def _cache(cache_dir) -> Path:
    if cache_dir:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        return Path(cache_dir)
    return cache.cache_dir("tools")


@contextlib.contextmanager
def _exclusive(cache: Path, name: str):
    """One process at a time fills an entry (scripts/test runs `pdctl-lab up` beside the unit tests,
    and both may want the same tool on a cold cache)."""
    with open(cache / (".%s.lock" % name), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_vllm_rs(cache_dir=None) -> Path:
    """Return the path of ``vllm-rs`` from the vllm wheel, downloading the wheel once."""
    cache = _cache(cache_dir)
    with _exclusive(cache, "vllm-%s" % VLLM_VERSION):
        return _ensure_vllm_rs(cache)


def _ensure_vllm_rs(cache: Path) -> Path:
    binary = cache / f"vllm-{VLLM_VERSION}" / "vllm-rs"
    if binary.exists():
        return binary
    wheel = _wheel(cache / "wheels")
    binary.parent.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_suffix(".part")
    with zipfile.ZipFile(wheel) as zf, zf.open("vllm/vllm-rs") as src, open(tmp, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    tmp.replace(binary)
    return binary


def vllm_wheel(cache_dir=None) -> Path:
    """The vllm==0.33.0 wheel itself (downloaded once, as ensure_vllm_rs does): the conformance tests read
    its source to compare the engine stand-in with it."""
    cache = _cache(cache_dir)
    with _exclusive(cache, "vllm-%s" % VLLM_VERSION):
        return _wheel(cache / "wheels")


def _wheel(wheels: Path) -> Path:
    wheel = _find_wheel(wheels)
    if wheel is None:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--dest", str(wheels), f"vllm=={VLLM_VERSION}"],
            check=True,
        )
        wheel = _find_wheel(wheels)
        if wheel is None:
            raise RuntimeError(f"pip download left no vllm {VLLM_VERSION} wheel in {wheels}")
    return wheel


def _find_wheel(wheels: Path):
    found = sorted(wheels.glob(f"vllm-{VLLM_VERSION}-*.whl")) if wheels.exists() else []
    return found[0] if found else None


def ensure_vllm_router(cache_dir=None) -> Path:
    """Return the path of the ``vllm-router`` binary in a dedicated virtualenv."""
    cache = _cache(cache_dir)
    with _exclusive(cache, "vllm-router-%s" % VLLM_ROUTER_VERSION):
        return _ensure_vllm_router(cache)


def _ensure_vllm_router(cache: Path) -> Path:
    env = cache / f"vllm-router-{VLLM_ROUTER_VERSION}"
    binary = env / "bin" / "vllm-router"
    if binary.exists():
        return binary
    if not (env / "bin" / "python").exists():
        venv.EnvBuilder(with_pip=True, clear=True).create(env)
    subprocess.run(
        [str(env / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
         f"vllm-router=={VLLM_ROUTER_VERSION}"],
        check=True,
    )
    if not binary.exists():
        raise RuntimeError(f"vllm-router {VLLM_ROUTER_VERSION} installed no {binary}")
    return binary


if __name__ == "__main__":  # python -m pdctl.lab.tools
    print(ensure_vllm_rs())
    print(ensure_vllm_router())
