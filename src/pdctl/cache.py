"""Where pdctl keeps what it downloads or builds once on the controller (one place, one variable).

PDCTL_CACHE_DIR, else $XDG_CACHE_HOME/pdctl, else ~/.cache/pdctl. CI points PDCTL_CACHE_DIR at an
empty directory so that every run takes the path a new machine takes.
"""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """The cache directory (or a subdirectory of it), created if missing."""
    base = os.environ.get("PDCTL_CACHE_DIR")
    if base:
        root = Path(base)
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pdctl"
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
