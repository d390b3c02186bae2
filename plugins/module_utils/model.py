# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model weights: manifest, parallel verification, resumable fill and atomic layout.

Pure standard library: used by library/model_*.py on the hosts and by the pdctl CLI
(`pdctl.model`) on the controller.

On-disk layout for a served path such as /mnt/model/glm/GLM-5.2-NVFP4:

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

import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.error import HTTPError, URLError
from urllib.parse import quote, unquote, urlsplit
from urllib.request import Request, urlopen

MANIFEST_FORMAT = 1
MANIFEST_NAME = ".pdctl-manifest.json"   # at the root of a mirror dir or of a fan-out server
CHUNK = 8 * 1024 * 1024                  # large reads: hashlib releases the GIL on buffers > 2 KiB
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
DEFAULT_HUB = "https://huggingface.co"


class ModelError(Exception):
    """A failure an operator must act on; `problems` lists every file that is wrong."""

    def __init__(self, msg, problems=None):
        self.problems = list(problems or [])
        super().__init__(msg)


def workers_default():
    return max(1, os.cpu_count() or 1)


def gib(n):
    return "%.2f GiB" % (n / 1024.0 ** 3)


# --------------------------------------------------------------------------- manifest

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


# --------------------------------------------------------------------------- hashing

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


# --------------------------------------------------------------------------- verification

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


# --------------------------------------------------------------------------- layout

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
    """Free bytes for an unprivileged writer on path's filesystem (tests monkeypatch this)."""
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


# --------------------------------------------------------------------------- sources

def redact(url):
    """A URL safe to log: no userinfo, no query string."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += ":%d" % parts.port
    return "%s://%s%s" % (parts.scheme, host, parts.path) if parts.scheme else url


class DirSource:
    """A local or NFS mirror directory (its .pdctl-manifest.json, when present, pins the revision)."""

    def __init__(self, root):
        self.root = os.path.abspath(root)
        self.label = self.root

    def manifest(self, revision):
        path = os.path.join(self.root, MANIFEST_NAME)
        if os.path.exists(path):
            return load_manifest(path)
        if not os.path.isdir(self.root):
            raise ModelError("source directory %s does not exist" % self.root)
        # No recorded digests: sizes only; the fill hashes what it copies (trust on first use).
        files = [{"path": r, "size": os.path.getsize(os.path.join(self.root, r))} for r in scan_dir(self.root)]
        return make_manifest(revision, files, source=self.root)

    def open(self, rel, offset):
        try:
            fh = open(os.path.join(self.root, rel), "rb", buffering=0)
        except OSError as exc:
            raise ModelError("%s: missing from source %s (%s)" % (rel, self.root, exc.strerror))
        fh.seek(offset)
        return fh, offset


class HttpSource:
    """A plain HTTP(S) tree: a fan-out server (model_serve) or an artifact store."""

    def __init__(self, base_url, headers=None, timeout=60):
        self.base = base_url.rstrip("/") + "/"
        self.headers = dict(headers or {})
        self.timeout = timeout
        self.label = redact(self.base)

    def _request(self, url, offset=0):
        req = Request(url)
        for k, v in self.headers.items():
            # Unredirected: a token must not follow a redirect to a CDN or another host.
            req.add_unredirected_header(k, v)
        if offset:
            req.add_header("Range", "bytes=%d-" % offset)
        return req

    def url(self, rel):
        return self.base + quote(rel)

    def get_json(self, url):
        try:
            with urlopen(self._request(url), timeout=self.timeout) as resp:
                return json.loads(resp.read().decode()), resp.headers
        except HTTPError as exc:
            raise self._error(exc, url)
        except (URLError, OSError, ValueError) as exc:
            raise ModelError("cannot read %s: %s" % (redact(url), getattr(exc, "reason", exc)))

    def _error(self, exc, url):
        return ModelError("%s answered HTTP %d %s" % (redact(url), exc.code, exc.reason))

    def manifest(self, revision):
        data, _ = self.get_json(self.url(MANIFEST_NAME))
        return make_manifest(data["revision"], data["files"], data.get("source"))

    def open(self, rel, offset):
        url = self.url(rel)
        try:
            resp = urlopen(self._request(url, offset), timeout=self.timeout)
        except HTTPError as exc:
            raise ModelError("%s: %s" % (rel, self._error(exc, url)))
        except (URLError, OSError) as exc:
            raise ModelError("%s: cannot read %s: %s" % (rel, redact(url), getattr(exc, "reason", exc)))
        if offset and resp.status != 206:
            return resp, 0        # server ignored the range: restart the file from byte 0
        return resp, offset


class HubSource(HttpSource):
    """Hugging Face Hub, through its documented HTTP API.

    GET {endpoint}/api/models/{repo}/revision/{rev}        -> {"sha": commit}
    GET {endpoint}/api/models/{repo}/tree/{sha}?recursive=true
        -> pages of {"type","path","size","oid", "lfs": {"oid": sha256, "size"}}; next page in Link rel="next"
    GET {endpoint}/{repo}/resolve/{sha}/{path}              -> bytes (Range supported, may redirect to a CDN)
    Non-LFS files carry only their git blob id (sha1 of "blob <size>\\0" + content); we check that instead.
    """

    def __init__(self, repo_id, revision, token=None, endpoint=DEFAULT_HUB, timeout=60):
        headers = {"Authorization": "Bearer %s" % token} if token else {}
        self.repo_id, self.endpoint = repo_id, endpoint.rstrip("/")
        self.revision = revision
        super().__init__("%s/%s/resolve/%s/" % (self.endpoint, repo_id, quote(revision, safe="")), headers, timeout)
        self.label = "hf://%s@%s" % (repo_id, revision)

    def _error(self, exc, url):
        code = exc.headers.get("X-Error-Code", "") if exc.headers else ""
        if code == "RevisionNotFound" or (exc.code == 404 and "/revision/" in url):
            return ModelError("revision %s not found in Hub repo %s" % (self.revision, self.repo_id))
        if code in ("RepoNotFound", "GatedRepo") or exc.code in (401, 403):
            return ModelError("Hub repo %s: HTTP %d %s (repo missing, gated, or the token lacks access)"
                              % (self.repo_id, exc.code, code or exc.reason))
        return ModelError("Hub %s answered HTTP %d %s %s" % (redact(url), exc.code, exc.reason, code))

    def resolve(self):
        data, _ = self.get_json("%s/api/models/%s/revision/%s" % (self.endpoint, self.repo_id,
                                                                  quote(self.revision, safe="")))
        sha = data.get("sha")
        if SHA1_RE.match(self.revision) and sha != self.revision:
            raise ModelError("Hub repo %s resolved revision %s to %s" % (self.repo_id, self.revision, sha))
        return sha

    def manifest(self, revision):
        sha = self.resolve()
        # Download from the commit, not from a branch name that could move mid-fill.
        self.base = "%s/%s/resolve/%s/" % (self.endpoint, self.repo_id, sha)
        url = "%s/api/models/%s/tree/%s?recursive=true" % (self.endpoint, self.repo_id, sha)
        files = []
        while url:
            entries, headers = self.get_json(url)
            for e in entries:
                if e.get("type") != "file" or any(p.startswith(".") for p in e["path"].split("/")):
                    continue
                lfs = e.get("lfs")
                if lfs:
                    files.append({"path": e["path"], "size": lfs["size"], "sha256": lfs["oid"]})
                else:
                    files.append({"path": e["path"], "size": e["size"], "git_oid": e["oid"]})
            url = _next_link(headers.get("Link", ""))
        return make_manifest(sha, files, source=self.label)


def _next_link(header):
    for part in header.split(","):
        m = re.match(r'\s*<([^>]+)>\s*;.*rel="?next"?', part)
        if m:
            return m.group(1)
    return None


def open_source(source, revision, token=None, hub_endpoint=DEFAULT_HUB):
    """hf://org/name | http(s)://host/path/ | /a/directory."""
    if source.startswith("hf://"):
        return HubSource(source[len("hf://"):].strip("/"), revision, token, hub_endpoint)
    if source.startswith(("http://", "https://")):
        return HttpSource(source, {"Authorization": "Bearer %s" % token} if token else None)
    return DirSource(source)


# --------------------------------------------------------------------------- fill

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
    key = lambda m: [(f["path"], f["size"], f.get("sha256")) for f in m["files"]]  # noqa: E731
    if all(f.get("sha256") for f in b["files"]):
        return key(a) == key(b)
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


# --------------------------------------------------------------------------- fan-out server

class _FanoutHandler(BaseHTTPRequestHandler):
    server_version = "pdctl-model-fanout"

    def log_message(self, *args):   # quiet; the server keeps counters instead
        pass

    def do_POST(self):
        srv = self.server
        srv.touch()
        if self.path == "/.pdctl/shutdown/%s" % srv.nonce and srv.nonce:
            self.send_response(204)
            self.end_headers()
            srv.stop_requested = True
            return
        self.send_error(404)

    def do_HEAD(self):
        self._serve(body=False)

    def do_GET(self):
        self._serve(body=True)

    def _serve(self, body):
        srv = self.server
        srv.touch(+1)
        try:
            rel = unquote(self.path.split("?", 1)[0].lstrip("/"))
            if rel == MANIFEST_NAME:
                data = json.dumps(srv.manifest).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)
                return
            if rel not in srv.files:     # only manifest files: nothing else on the host is reachable
                self.send_error(404)
                return
            path = os.path.join(srv.root, rel)
            size = os.path.getsize(path)
            start = 0
            m = re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))
            if m:
                start = int(m.group(1))
                if start >= size:
                    self.send_error(416)
                    return
                self.send_response(206)
                self.send_header("Content-Range", "bytes %d-%d/%d" % (start, size - 1, size))
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(size - start))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if body:
                with open(path, "rb") as fh:
                    sent = self.connection.sendfile(fh, start, size - start)
                srv.add_sent(sent)
        finally:
            srv.touch(-1)


class FanoutServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root, manifest, bind, port, nonce):
        self.root, self.manifest, self.nonce = root, manifest, nonce
        self.files = {f["path"] for f in manifest["files"]}
        self.bytes_sent = 0
        self.active = 0
        self.last = time.monotonic()
        self.stop_requested = False
        self._lock = threading.Lock()
        if ":" in bind:
            self.address_family = socket.AF_INET6
        super().__init__((bind, port), _FanoutHandler)

    def touch(self, delta=0):
        with self._lock:
            self.active += delta
            self.last = time.monotonic()

    def add_sent(self, n):
        with self._lock:
            self.bytes_sent += n


def serve(served_path, revision, bind="0.0.0.0", port=8790, idle_timeout=300, max_seconds=86400,
          nonce=None, ready=None):
    """Serve a verified version until shut down (POST /.pdctl/shutdown/<nonce>), idle or out of time."""
    st = status(served_path, revision)
    if not st["verified"]:
        raise ModelError("cannot serve %s: revision %s is not the verified current version (%s)"
                         % (served_path, revision, "; ".join(st["problems"]) or
                            "current is %s" % st["current_revision"]))
    lay = Layout(served_path)
    manifest = load_manifest(lay.manifest_path(revision))
    srv = FanoutServer(lay.version_dir(revision), manifest, bind, port, nonce)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    if ready:
        ready(srv)
    started = time.monotonic()
    reason = "max_seconds"
    try:
        while time.monotonic() - started < max_seconds:
            time.sleep(0.2)
            if srv.stop_requested:
                reason = "shutdown"
                break
            if srv.active == 0 and time.monotonic() - srv.last > idle_timeout:
                reason = "idle"
                break
    finally:
        srv.shutdown()
        srv.server_close()
    return {"bytes_sent": srv.bytes_sent, "stopped": reason, "seconds": round(time.monotonic() - started, 1),
            "manifest_digest": manifest_digest(manifest)}
