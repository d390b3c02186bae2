# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Top-level `pdctl_*` inventory variables that nothing reads: a misspelling Ansible accepts without a word
(the quarantine floor's name without its final s silently leaves quarantine off).

The known names are not a list kept by hand: they are every `pdctl_*` name that the collection's own code
mentions (roles, playbooks, plugins, library), and those the pdctl package mentions where it is installed (its
`pdctl stage` and the lab read a few: pdctl_stage_*, pdctl_lab_*). The package is no part of the built
collection; in a checkout it is src/pdctl. Inventories are deliberately not a source: defining a name is not
reading it.
"""
from __future__ import annotations

import difflib
import functools
import importlib.util
import os
import re

NAME = re.compile(r"\bpdctl_[a-z0-9_]+")
# Where variables are read, relative to the collection root (what exists there is scanned).
SOURCES = ("roles", "playbooks", "plugins", "library")
SUFFIXES = (".yml", ".yaml", ".j2", ".py", ".cfg", ".ini", ".json")


def collection_root():
    """The collection's top directory: plugins/module_utils/<this file> is two levels below it."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def package_dir():
    """The pdctl package's directory where the controller's Python has it (a checkout's src/pdctl, or wherever
    pip installed it), else None. Found, not imported."""
    try:
        spec = importlib.util.find_spec("pdctl")
    except (ImportError, ValueError):
        return None
    return list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else None


@functools.lru_cache(maxsize=4)
def known_variables(root=None):
    """frozenset of every pdctl_* name the collection's code, and the pdctl package where installed, mention."""
    root = root or collection_root()
    names = set()
    sources = [os.path.join(root, source) for source in SOURCES]
    if package_dir():
        sources.append(package_dir())
    for source in sources:
        for base, dirs, files in os.walk(source):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith(SUFFIXES):
                    with open(os.path.join(base, name), encoding="utf-8", errors="replace") as handle:
                        names.update(NAME.findall(handle.read()))
    return frozenset(names)


def unread_names(raw_vars):
    """The host's pdctl_* names minus those its own variables read in a template (`{{ pdctl_lab_dir }}/...`):
    a helper variable the inventory itself reads is not a typo. raw_vars: the untemplated variables."""
    reads = set()

    def walk(value):
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif isinstance(value, str) and "Encrypted" not in type(value).__name__ and "Vault" not in type(value).__name__:
            text = str.__str__(value)  # a vaulted value is never decrypted here (skipped above)
            if "{{" in text or "{%" in text:
                reads.update(NAME.findall(text))

    walk(dict(raw_vars))
    return sorted(k for k in raw_vars if k.startswith("pdctl_") and k not in reads)


def unknown_variables(names_by_host, known):
    """Problems, one per unknown name: the hosts that have it and the nearest known name.

    names_by_host: {host: [variable names]} (only pdctl_* names are judged)."""
    where = {}
    for host in sorted(names_by_host):
        for name in names_by_host[host] or ():
            if name.startswith("pdctl_") and name not in known:
                where.setdefault(name, []).append(host)
    problems = []
    for name in sorted(where):
        near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        problems.append("unknown variable %s on %s: no role, playbook or plugin reads it%s" % (
            name, ", ".join(where[name]), " (did you mean %s?)" % near[0] if near else ""))
    return problems
