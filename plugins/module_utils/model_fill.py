# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model weights, the fill: bring a revision from a source to the served path (plan, disk preflight,
resumable copy hashed while copying, verification, publish), and the repair of damaged files.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model_hashing import CHUNK, Progress, fast_check, gib, write_marker
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model_layout import Layout, free_bytes, fsync_dir, status
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model_manifest import (
    ModelError, load_manifest, make_manifest, manifest_digest, total_size, write_json_atomic)
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model_sources import DEFAULT_HUB, HttpSource, HubSource, open_source


def plan_fill(lay, manifest, reuse=None):
    """Per file: bytes to fetch, after partial files and identical files of the current version."""
    staging = lay.staging_dir(manifest["revision"])
    reuse = reuse or {}
    plan = []
    for f in manifest["files"]:
        have = 0
        try:
            have = os.path.getsize(os.path.join(staging, f["path"]))
        except OSError:
            pass
        if have > f["size"]:
            have = 0
        link = reuse.get((f["path"], f["size"], f.get("sha256"))) if f.get("sha256") and not have else None
        plan.append({"file": f, "have": have, "link": link, "need": 0 if link else f["size"] - have})
    return plan


def _reuse_index(lay):
    """Files of the current version that a new revision can hardlink instead of copying."""
    try:
        manifest = lay.current_manifest()
    except ModelError:
        return {}
    root = manifest and lay.version_dir(manifest["revision"])
    if not manifest or not fast_check(root, manifest, lay.marker_path(manifest["revision"])):
        return {}     # only reuse a version whose marker still vouches for it
    return {(f["path"], f["size"], f.get("sha256")): os.path.join(root, f["path"])
            for f in manifest["files"] if f.get("sha256")}


def _fill_one(src, staging, item, progress, counter):
    """Copy one file into staging from `have` on; hash the whole file while at it."""
    f = item["file"]
    dest = os.path.join(staging, f["path"])
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    if item["link"]:
        if os.path.exists(dest):
            os.unlink(dest)
        os.link(item["link"], dest)
        return f["path"], f.get("sha256"), None, f["size"]
    sha, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % f["size"])
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(dest, "ab+") as out:
        have = item["have"]
        out.truncate(have)             # drops anything past a usable prefix (appends go to the end)
        out.seek(0)
        while out.tell() < have:        # hash the bytes kept from an earlier, interrupted fill
            n = out.readinto(view[:min(CHUNK, have - out.tell())])
            if not n:
                break
            sha.update(view[:n])
            sha1.update(view[:n])
        if have < f["size"]:
            stream, start = src.open(f["path"], have)
            with stream:
                if start != have:        # source could not resume: start over
                    out.truncate(0)
                    sha, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % f["size"])
                    have = 0
                while True:
                    n = stream.readinto(buf)
                    if not n:
                        break
                    out.write(view[:n])
                    sha.update(view[:n])
                    sha1.update(view[:n])
                    counter.add(n)
                    progress.add(n)
        out.flush()
        os.fsync(out.fileno())
    return f["path"], sha.hexdigest(), sha1.hexdigest(), os.path.getsize(dest)


class _Counter:
    def __init__(self):
        self.n = 0
        self.lock = threading.Lock()

    def add(self, n):
        with self.lock:
            self.n += n


def sync(served_path, source, revision, token=None, hub_endpoint=DEFAULT_HUB, check_mode=False,
         expected_digest=None, margin_pct=10, jobs=4, workers=None, emit=None, switch=True):
    """Bring `revision` to the served path from `source`; return a result dict for exit_json.

    Order of work (each step only when needed): status of the current layout; manifest from the
    source; disk preflight; resumable fill of the staging dir (hashing while copying); verification
    against the manifest; rename staging -> version; marker; atomic symlink switch.
    """
    lay = Layout(served_path)
    label = source
    result = {"changed": False, "path": lay.served, "revision": revision, "bytes_from_source": 0}
    current = status(served_path, revision, workers=workers)
    result["previous_revision"] = current["current_revision"]
    if current["verified"]:
        if current["checked"] == "full" and not check_mode:
            # Content is right but the marker was stale (e.g. touched mtimes): refresh it so the
            # next run is a fast no-op again. Bookkeeping only, the served bytes did not change.
            write_marker(lay.marker_path(revision), lay.version_dir(revision),
                         load_manifest(lay.manifest_path(revision)))
        result.update(manifest_digest=current["manifest_digest"], size=current["size"], action="current")
        return result
    if current["current_revision"] == revision and current.get("manifest_digest"):
        return _repair(lay, source, revision, token, hub_endpoint, current, result, check_mode, jobs, emit)
    src = open_source(source, revision, token, hub_endpoint)
    label = src.label
    result["source"] = label
    if check_mode and isinstance(src, HttpSource) and not isinstance(src, HubSource):
        # A fan-out server only runs for real; report the change without contacting it.
        result.update(changed=True, action="would_fill")
        return result
    manifest = src.manifest(revision)
    revision = manifest["revision"] if isinstance(src, HubSource) else revision
    if manifest["revision"] != revision:
        raise ModelError("source %s holds revision %s, expected %s" % (label, manifest["revision"], revision))
    if isinstance(src, HubSource) and revision != result["revision"]:
        result["resolved_revision"] = revision
    if expected_digest and all(f.get("sha256") for f in manifest["files"]) \
            and manifest_digest(manifest) != expected_digest:
        raise ModelError("source %s: manifest digest %s, expected %s"
                         % (label, manifest_digest(manifest), expected_digest))
    if not manifest["files"]:
        raise ModelError("source %s lists no files for revision %s" % (label, revision))
    result["revision"] = revision
    result["size"] = total_size(manifest)
    result["files"] = len(manifest["files"])

    # Already laid out under .versions (e.g. a rollback target, or the fill finished but the switch did not)?
    vdir = lay.version_dir(revision)
    if os.path.isdir(vdir) and os.path.exists(lay.manifest_path(revision)):
        have_manifest = load_manifest(lay.manifest_path(revision))
        if _same_content(have_manifest, manifest) and fast_check(vdir, have_manifest, lay.marker_path(revision)):
            result.update(changed=True, action="switched", manifest_digest=manifest_digest(have_manifest))
            if not check_mode and switch:
                lay.switch(revision)
            return result

    plan = plan_fill(lay, manifest, _reuse_index(lay))
    need = sum(p["need"] for p in plan)
    result["bytes_to_fetch"] = need
    result["files_to_fetch"] = sorted(p["file"]["path"] for p in plan if p["need"])
    wanted = int(need * (1 + margin_pct / 100.0))
    probe = lay.versions if os.path.isdir(lay.versions) else _existing_parent(lay.versions)
    free = free_bytes(probe)
    result["free_bytes"] = free
    if wanted > free:
        raise ModelError("not enough free space on the filesystem of %s for revision %s: need %s "
                         "(%s to fetch + %d%% margin), found %s free"
                         % (probe, revision, gib(wanted), gib(need), margin_pct, gib(free)))
    result.update(changed=True, action="would_fill" if check_mode else "filled")
    if check_mode:
        return result

    staging = lay.staging_dir(revision)
    os.makedirs(staging, exist_ok=True)
    progress = Progress("fill %s from %s" % (revision, label), need, emit)
    counter = _Counter()
    started = time.time()
    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            hashed = dict((p, (s, g, n)) for p, s, g, n in
                          pool.map(lambda item: _fill_one(src, staging, item, progress, counter), plan))
    except (OSError, http.client.HTTPException) as exc:
        raise ModelError("fill of revision %s from %s interrupted after %d bytes: %s; run again to resume"
                         % (revision, label, counter.n, exc))
    finally:
        result["bytes_from_source"] = counter.n
        lay.log_transfer({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "source": label,
                          "revision": revision, "bytes_from_source": counter.n,
                          "seconds": round(time.time() - started, 3)})

    problems = _check_hashes(manifest, hashed)
    if problems:
        for rel in {p.split(": ", 1)[0] for p in problems}:
            os.unlink(os.path.join(staging, rel))     # a re-run fetches these again
        raise ModelError("revision %s from %s failed verification; the served path was not changed"
                         % (revision, label), problems)
    # Record what we verified; the TOFU case (no sha256 from the source) gets it from our hashing.
    manifest = make_manifest(revision, [dict(f, sha256=f.get("sha256") or hashed[f["path"]][0])
                                        for f in manifest["files"]], source=label)
    for f in manifest["files"]:
        os.chmod(os.path.join(staging, f["path"]), 0o444)   # published files are never rewritten
    if os.path.isdir(vdir):
        shutil.rmtree(vdir)     # an unverified leftover of an older attempt
    write_json_atomic(lay.manifest_path(revision), manifest)
    os.rename(staging, vdir)
    fsync_dir(lay.versions)
    write_marker(lay.marker_path(revision), vdir, manifest)
    if switch:
        lay.switch(revision)
    result["manifest_digest"] = manifest_digest(manifest)
    return result


def _repair(lay, source, revision, token, hub_endpoint, current, result, check_mode, jobs, emit):
    """The served revision has damaged files: fetch just those again and rename each into place."""
    manifest = load_manifest(lay.manifest_path(revision))
    bad = sorted({p.split(": ", 1)[0] for p in current["problems"]})
    result.update(changed=True, action="would_repair" if check_mode else "repaired", problems=current["problems"],
                  files_to_fetch=bad, manifest_digest=manifest_digest(manifest), size=total_size(manifest))
    src = open_source(source, revision, token, hub_endpoint)
    result["source"] = src.label
    if check_mode:
        return result
    if isinstance(src, HubSource):
        src.manifest(revision)      # resolves the commit the files are fetched from
    unknown = [rel for rel in bad if rel not in {f["path"] for f in manifest["files"]}]
    if unknown:
        raise ModelError("%s holds files that revision %s does not list: %s; remove them"
                         % (lay.version_dir(revision), revision, ", ".join(unknown)), current["problems"])
    subset = make_manifest(revision, [f for f in manifest["files"] if f["path"] in bad])
    plan = plan_fill(lay, subset)
    staging = lay.staging_dir(revision)
    counter = _Counter()
    progress = Progress("repair %s from %s" % (revision, src.label), sum(p["need"] for p in plan), emit)
    try:
        hashed = {p: (s, g, n) for p, s, g, n in
                  (_fill_one(src, staging, item, progress, counter) for item in plan)}
    finally:
        result["bytes_from_source"] = counter.n
        lay.log_transfer({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "source": src.label,
                          "revision": revision, "bytes_from_source": counter.n, "repair": bad})
    problems = _check_hashes(subset, hashed)
    if problems:
        raise ModelError("repair of revision %s from %s failed verification" % (revision, src.label), problems)
    for rel in bad:
        os.chmod(os.path.join(staging, rel), 0o444)
        os.replace(os.path.join(staging, rel), os.path.join(lay.version_dir(revision), rel))
    shutil.rmtree(staging, ignore_errors=True)
    write_marker(lay.marker_path(revision), lay.version_dir(revision), manifest)
    return result


def _same_content(a, b):
    if all(f.get("sha256") for f in b["files"]):
        return [(f["path"], f["size"], f.get("sha256")) for f in a["files"]] == \
            [(f["path"], f["size"], f.get("sha256")) for f in b["files"]]
    return [(f["path"], f["size"]) for f in a["files"]] == [(f["path"], f["size"]) for f in b["files"]]


def _existing_parent(path):
    while not os.path.isdir(path):
        path = os.path.dirname(path)
    return path


def _check_hashes(manifest, hashed):
    problems = []
    for f in manifest["files"]:
        sha, sha1, size = hashed[f["path"]]
        if size != f["size"]:
            problems.append("%s: expected %d bytes, found %d" % (f["path"], f["size"], size))
        elif f.get("sha256") and sha != f["sha256"]:
            problems.append("%s: sha256 expected %s, found %s" % (f["path"], f["sha256"], sha))
        elif f.get("git_oid") and sha1 is not None and sha1 != f["git_oid"]:
            problems.append("%s: git blob id expected %s, found %s" % (f["path"], f["git_oid"], sha1))
    return problems
