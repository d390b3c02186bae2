# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model weights, the fan-out: a one-shot HTTP server of a verified revision (only its manifest's
files, sendfile, Range), stopped by POST /.pdctl/shutdown/<nonce>, idleness or a time limit.
"""
from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model_layout import Layout, status
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model_manifest import MANIFEST_NAME, ModelError, load_manifest, manifest_digest


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


def serve(served_path, revision, bind, port, idle_timeout=300, max_seconds=86400,
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
