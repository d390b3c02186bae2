# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model weights, the on-disk layout of a served path and its status (read-only), switch and prune.

  GLM-5.2-NVFP4 -> .GLM-5.2-NVFP4.versions/<revision>    symlink, the only thing vLLM sees
  .GLM-5.2-NVFP4.versions/<revision>/                   complete, verified tree (read-only files)
  .GLM-5.2-NVFP4.versions/<revision>.partial/           staging while filling (resumable)
  .GLM-5.2-NVFP4.versions/<revision>.manifest.json      expected path/size/sha256 of every file
  .GLM-5.2-NVFP4.versions/<revision>.verified.json      marker: manifest digest + size/mtime seen at verification
  .GLM-5.2-NVFP4.versions/transfers.jsonl               one line per fill: source, bytes read from it
  .GLM-5.2-NVFP4.versions/progress.log                  progress of the running fill/verify (tail -f)

Staging sits beside the versions on the same filesystem, so publishing is two renames:
the staging dir to its final name, then a temporary symlink over the served path.
A reader of the served path sees the old tree or the new one, never a mix.
"""
from __future__ import annotations

import json
import os
import shutil

from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model_hashing import fast_check, verify_tree
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model_manifest import ModelError, check_revision, load_manifest, manifest_digest, total_size


class Layout:
    def __init__(self, served_path):
        self.served = os.path.abspath(served_path)
        self.parent, self.name = os.path.split(self.served)
        self.versions = os.path.join(self.parent, ".%s.versions" % self.name)
        self.transfer_log = os.path.join(self.versions, "transfers.jsonl")
        self.progress_log = os.path.join(self.versions, "progress.log")

    def version_dir(self, rev):
        return os.path.join(self.versions, check_revision(rev))

    def staging_dir(self, rev):
        return self.version_dir(rev) + ".partial"

    def manifest_path(self, rev):
        return self.version_dir(rev) + ".manifest.json"

    def marker_path(self, rev):
        return self.version_dir(rev) + ".verified.json"

    def current(self):
        """Revision the served path points at, None when absent; refuses a real directory."""
        if not os.path.lexists(self.served):
            return None
        if not os.path.islink(self.served):
            raise ModelError("%s exists and is not a symlink managed by pdctl: move it away first "
                             "(expected a link into %s)" % (self.served, self.versions))
        target = os.path.normpath(os.path.join(self.parent, os.readlink(self.served)))
        if os.path.dirname(target) != self.versions:
            raise ModelError("%s points at %s, outside %s" % (self.served, target, self.versions))
        return os.path.basename(target)

    def current_manifest(self):
        rev = self.current()
        if rev is None or not os.path.exists(self.manifest_path(rev)):
            return None
        return load_manifest(self.manifest_path(rev))

    def switch(self, rev):
        """Point the served path at a version: rename of a temporary symlink (atomic)."""
        tmp = "%s.pdctl-switch-%d" % (self.served, os.getpid())
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(os.path.relpath(self.version_dir(rev), self.parent), tmp)
        os.replace(tmp, self.served)
        fsync_dir(self.parent)

    def log_transfer(self, record):
        os.makedirs(self.versions, exist_ok=True)
        with open(self.transfer_log, "a") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def free_bytes(path):
    """Free bytes for an unprivileged writer on path's filesystem (tests monkeypatch model_fill.free_bytes)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def status(served_path, revision, full=False, workers=None, progress=None):
    """Read-only: is `revision` laid out, current and verified?"""
    lay = Layout(served_path)
    out = {"path": lay.served, "revision": revision, "current_revision": lay.current(),
           "verified": False, "checked": "none", "problems": []}
    if out["current_revision"] != revision:
        return out
    if not os.path.exists(lay.manifest_path(revision)):
        out["problems"] = ["%s: no manifest recorded for revision %s" % (lay.manifest_path(revision), revision)]
        return out
    manifest = load_manifest(lay.manifest_path(revision))
    out["manifest_digest"] = manifest_digest(manifest)
    out["size"] = total_size(manifest)
    out["files"] = len(manifest["files"])
    if not full and fast_check(lay.version_dir(revision), manifest, lay.marker_path(revision)):
        out.update(verified=True, checked="fast")
        return out
    out["problems"] = verify_tree(lay.version_dir(revision), manifest, workers, progress)
    out.update(verified=not out["problems"], checked="full")
    return out


def prune(served_path, keep=1):
    """Remove versions other than the current one and the `keep` most recent others."""
    lay = Layout(served_path)
    current = lay.current()
    if not os.path.isdir(lay.versions):
        return []
    others = [d for d in os.listdir(lay.versions)
              if os.path.isdir(os.path.join(lay.versions, d)) and d != current and not d.endswith(".partial")]
    others.sort(key=lambda d: os.path.getmtime(os.path.join(lay.versions, d)), reverse=True)
    removed = others[keep:]
    for d in removed:
        shutil.rmtree(os.path.join(lay.versions, d))
        for suffix in (".manifest.json", ".verified.json"):
            if os.path.exists(os.path.join(lay.versions, d + suffix)):
                os.unlink(os.path.join(lay.versions, d + suffix))
    return removed
