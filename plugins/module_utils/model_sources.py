# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model weights, sources: a mirror directory, a plain HTTP(S) tree (fan-out server, artifact store)
and the Hugging Face Hub (documented HTTP API, no client library). Each gives a manifest and
opens a file at an offset (Range) for the fill.
"""
from __future__ import annotations

import json
import os
import re
from urllib.error import HTTPError, URLError
from urllib.parse import quote, urlsplit

from ansible.module_utils.urls import open_url

from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model_manifest import MANIFEST_NAME, ModelError, load_manifest, make_manifest, scan_dir

SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
DEFAULT_HUB = "https://huggingface.co"


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

    def _open(self, url, offset=0):
        headers = dict(self.headers)
        if offset:
            headers["Range"] = "bytes=%d-" % offset
        # Unredirected: a token must not follow a redirect to a CDN or another host.
        return open_url(url, headers=headers, unredirected_headers=list(self.headers), timeout=self.timeout,
                        follow_redirects="all", http_agent="pdctl-model-sync")

    def url(self, rel):
        return self.base + quote(rel)

    def get_json(self, url):
        try:
            with self._open(url) as resp:
                return json.loads(resp.read().decode()), resp.headers
        except HTTPError as exc:
            raise self._error(exc, url)
        except (URLError, OSError, ValueError) as exc:
            raise ModelError("cannot read %s: %s" % (redact(url), getattr(exc, "reason", exc)))

    def _error(self, exc, url):
        return ModelError("%s answered HTTP %d %s" % (redact(url), exc.code, exc.reason))

    def manifest(self, revision):
        data = self.get_json(self.url(MANIFEST_NAME))[0]
        return make_manifest(data["revision"], data["files"], data.get("source"))

    def open(self, rel, offset):
        url = self.url(rel)
        try:
            resp = self._open(url, offset)
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
        data = self.get_json("%s/api/models/%s/revision/%s" % (self.endpoint, self.repo_id, quote(self.revision, safe="")))[0]
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
