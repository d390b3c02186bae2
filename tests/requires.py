"""A dependency a test needs and cannot find: skipped with the reason on a developer machine, a failure in CI.

Bootstrap installs everything the suite uses (NIXL, dpkg-deb, the vllm-rs client), so in CI (CI=true) a
missing one means the environment is broken and must not read as green. This is the one place where the
suite may skip (tests/unit/test_test_guard.py keeps it so).
"""
from __future__ import annotations

import importlib
import os
import shutil

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(what: str, why: str):
    message = "%s is missing: %s" % (what, why)
    if in_ci():
        pytest.fail(message + " (CI=true: a missing dependency is a failure, not a skip)", pytrace=False)
    pytest.skip(message)


def binary(name: str, why: str) -> str:
    path = shutil.which(name)
    if path is None:
        missing("the %s command" % name, why)
    return path


def module(name: str, why: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:  # absent, or installed without what it loads
        missing("the Python module %s" % name, "%s (%s)" % (why, exc))
