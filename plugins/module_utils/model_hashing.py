# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model weights, hashing: parallel sha256 of files, progress lines, and verification of a tree
against its manifest (full, or the fast check of the marker's size/mtime record).
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model_manifest import manifest_digest, make_manifest, scan_dir, write_json_atomic

CHUNK = 8 * 1024 * 1024                  # large reads: hashlib releases the GIL on buffers > 2 KiB


def workers_default():
    return max(1, os.cpu_count() or 1)


def gib(n):
    return "%.2f GiB" % (n / 1024.0 ** 3)


class Progress:
    """Throttled progress lines to a callback (module: progress.log; CLI: stderr)."""

    def __init__(self, what, total, emit=None, every=5.0):
        self.what, self.total, self.emit, self.every = what, total, emit, every
        self.done = 0
        self.start = self.last = time.monotonic()
        self.lock = threading.Lock()

    def add(self, n):
        with self.lock:
            self.done += n
            now = time.monotonic()
            if self.emit is None or now - self.last < self.every:
                return
            self.last = now
        self.emit(self.line())

    def line(self):
        elapsed = max(time.monotonic() - self.start, 1e-6)
        rate = self.done / elapsed
        pct = 100.0 * self.done / self.total if self.total else 100.0
        eta = (self.total - self.done) / rate if rate > 0 else 0
        return "%s: %s / %s (%.1f%%) %.0f MiB/s eta %ds" % (
            self.what, gib(self.done), gib(self.total), pct, rate / 2 ** 20, eta)


def sha256_file(path, progress=None):
    h = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            if progress:
                progress.add(n)
    return h.hexdigest()


def git_blob_sha1(path):
    """The git object id of a small (non-LFS) file, as the Hub tree API reports it."""
    size = os.path.getsize(path)
    h = hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def hash_files(root, rels, workers=None, progress=None):
    """sha256 of many files in parallel threads (hashlib drops the GIL while hashing)."""
    rels = list(rels)
    # Biggest first, so the last worker does not start the largest shard alone.
    rels.sort(key=lambda r: -os.path.getsize(os.path.join(root, r)))
    with ThreadPoolExecutor(max_workers=workers or workers_default()) as pool:
        digests = pool.map(lambda r: sha256_file(os.path.join(root, r), progress), rels)
        return dict(zip(rels, digests))


def build_manifest(root, revision, workers=None, progress=None, source=None):
    rels = scan_dir(root)
    digests = hash_files(root, rels, workers, progress)
    files = [{"path": r, "size": os.path.getsize(os.path.join(root, r)), "sha256": digests[r]} for r in rels]
    return make_manifest(revision, files, source)


def _stat_record(root, manifest):
    out = {}
    for f in manifest["files"]:
        st = os.stat(os.path.join(root, f["path"]))
        out[f["path"]] = [st.st_size, st.st_mtime_ns]
    return out


def write_marker(marker_path, root, manifest):
    write_json_atomic(marker_path, {
        "manifest_digest": manifest_digest(manifest),
        "revision": manifest["revision"],
        "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": _stat_record(root, manifest),
    })


def fast_check(root, manifest, marker_path):
    """True when the marker records this manifest and every file still has its size and mtime."""
    try:
        with open(marker_path) as fh:
            marker = json.load(fh)
        return (marker.get("manifest_digest") == manifest_digest(manifest)
                and marker.get("files") == _stat_record(root, manifest))
    except (OSError, ValueError):
        return False


def verify_tree(root, manifest, workers=None, progress=None, extra_ok=False):
    """Hash every file; return a list of problems ('' list when the tree matches)."""
    problems = []
    present = []
    for f in manifest["files"]:
        path = os.path.join(root, f["path"])
        try:
            size = os.path.getsize(path)
        except OSError:
            problems.append("%s: expected %d bytes, found no file" % (f["path"], f["size"]))
            continue
        if size != f["size"]:
            problems.append("%s: expected %d bytes, found %d" % (f["path"], f["size"], size))
        else:
            present.append(f)
    digests = hash_files(root, [f["path"] for f in present], workers, progress)
    for f in present:
        found = digests[f["path"]]
        if f.get("sha256") and found != f["sha256"]:
            problems.append("%s: sha256 expected %s, found %s" % (f["path"], f["sha256"], found))
    if not extra_ok:
        expected = {f["path"] for f in manifest["files"]}
        for rel in scan_dir(root):
            if rel not in expected:
                problems.append("%s: not in the manifest of revision %s" % (rel, manifest["revision"]))
    return sorted(problems)
