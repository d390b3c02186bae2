# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model weights, the manifest: what a revision is (every file's path, size, sha256) and its digest.

The base of the model_* modules: ModelError, the manifest format and its JSON files, scan of a tree.
"""
from __future__ import annotations

import hashlib
import json
import os
import re

MANIFEST_FORMAT = 1
MANIFEST_NAME = ".pdctl-manifest.json"   # at the root of a mirror dir or of a fan-out server
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ModelError(Exception):
    """A failure an operator must act on; `problems` lists every file that is wrong."""

    def __init__(self, msg, problems=None):
        self.problems = list(problems or [])
        super().__init__(msg)


def check_revision(revision):
    if not isinstance(revision, str) or not REVISION_RE.match(revision):
        raise ModelError("revision %r is not usable as a directory name (letters, digits, . _ -)" % (revision,))
    return revision


def _check_rel(rel):
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ModelError("manifest path %r escapes the model directory" % rel)
    return rel


def make_manifest(revision, files, source=None):
    """files: iterable of dicts with path, size, sha256 (and optionally git_oid)."""
    entries = []
    for f in files:
        entry = {"path": _check_rel(str(f["path"])), "size": int(f["size"])}
        for key in ("sha256", "git_oid"):
            if f.get(key):
                entry[key] = str(f[key]).lower()
        entries.append(entry)
    entries.sort(key=lambda e: e["path"])
    manifest = {"format": MANIFEST_FORMAT, "revision": check_revision(revision), "files": entries}
    if source:
        manifest["source"] = source
    return manifest


def manifest_digest(manifest):
    """Digest over what identifies the content: revision and every path/size/sha256."""
    core = [[f["path"], f["size"], f.get("sha256")] for f in manifest["files"]]
    blob = json.dumps({"revision": manifest["revision"], "files": core}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def total_size(manifest):
    return sum(f["size"] for f in manifest["files"])


def load_manifest(path):
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ModelError("cannot read manifest %s: %s" % (path, exc))
    if data.get("format") != MANIFEST_FORMAT or not isinstance(data.get("files"), list):
        raise ModelError("%s is not a pdctl manifest (format %r)" % (path, data.get("format")))
    return make_manifest(data["revision"], data["files"], data.get("source"))


def write_json_atomic(path, data):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def scan_dir(root):
    """Relative paths of the regular files under root; hidden files and dirs are not model content."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if not name.startswith("."):
                full = os.path.join(dirpath, name)
                if os.path.isfile(full):
                    out.append(os.path.relpath(full, root).replace(os.sep, "/"))
    return sorted(out)
