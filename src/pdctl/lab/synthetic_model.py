"""A small stand-in for GLM-5.2-NVFP4, and a Hub-API stub that serves it.

`build(out_dir)` writes what the serving stack reads from a checkpoint directory: config.json
(model_type glm_moe_dsa, GlmMoeDsaForCausalLM), a tokenizer, model.safetensors.index.json and
safetensors shards (valid headers, deterministic pseudo-random payload). Same arguments, same
bytes: so the manifest, and the Hub-like revision derived from it, are stable across machines.

`HubStub` answers the parts of the Hugging Face Hub HTTP API that pdctl's model_sync uses
(revision lookup, recursive tree with LFS sha256/size and Link pagination, resolve with Range),
so tests and the lab exercise the real Hub client code without the Hub.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit, parse_qs

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import model_hashing, model_manifest

REPO_ID = "nvidia/GLM-5.2-NVFP4"  # the production source's repo id (inventories/*/model_source.yml)
# The real checkpoint is ~459 GB; the default synthetic one is the same layout at 1/300 of the size.
REAL_SIZE_GB = 459
CHUNK = 8 * 1024 * 1024


def _config():
    # Shape numbers are illustrative; the lab engine stand-in only checks type and architecture.
    return {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "hidden_size": 6144,
        "num_hidden_layers": 78,
        "num_attention_heads": 64,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "num_nextn_predict_layers": 1,
        "max_position_embeddings": 1048576,
        "vocab_size": 154880,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"},
        "pdctl_synthetic": True,
    }


def _tokenizer(out_dir):
    """The lab tokenizer when tokenizer.py exists; otherwise a clearly marked placeholder."""
    try:
        from pdctl.lab import tokenizer
    except ImportError:
        tokenizer = None
    if tokenizer is not None and hasattr(tokenizer, "build"):
        tokenizer.build(out_dir)
        return "pdctl.lab.tokenizer"
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as fh:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "pdctl_placeholder": True,
                   "note": "placeholder: src/pdctl/lab/tokenizer.py was not available"}, fh, indent=1)
    return "placeholder"


def _write_shard(path, tensors, rng, sha):
    """tensors: [(name, nbytes)]; U8 payloads laid end to end, header padded to 8 bytes."""
    header, offset = {"__metadata__": {"format": "pt", "pdctl_synthetic": "1"}}, 0
    for name, nbytes in tensors:
        header[name] = {"dtype": "U8", "shape": [nbytes // 4096, 4096], "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as fh:
        for part in (struct.pack("<Q", len(blob)), blob):
            fh.write(part)
            sha.update(part)
        left = offset
        while left:
            n = min(CHUNK, left)
            data = rng.randbytes(n)
            fh.write(data)
            sha.update(data)
            left -= n
    return offset


def build(out_dir, size_mb=1536, shards=None, seed=0):
    """Write the synthetic checkpoint; return {revision, manifest_digest, size, files, tokenizer}."""
    os.makedirs(out_dir, exist_ok=True)
    shards = shards or max(2, size_mb // 256)
    per_shard = max(4096, (size_mb * 1024 * 1024 // shards) // 4096 * 4096)
    rng = random.Random(seed)
    digests = {}
    weight_map, total = {}, 0
    layer = 0
    for i in range(shards):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        # Two tensors per shard: a big expert block and a small norm, like a real MoE layer shard.
        tensors = [("model.layers.%d.mlp.experts.weight_packed" % layer, per_shard - 4096),
                   ("model.layers.%d.input_layernorm.weight" % layer, 4096)]
        sha = hashlib.sha256()
        total += _write_shard(os.path.join(out_dir, name), tensors, rng, sha)
        digests[name] = sha.hexdigest()
        for tname, _ in tensors:
            weight_map[tname] = name
        layer += 1
    files = {
        "config.json": _config(),
        "generation_config.json": {"do_sample": True, "temperature": 1.0, "top_p": 0.95},
        "model.safetensors.index.json": {"metadata": {"total_size": total}, "weight_map": weight_map},
    }
    for name, data in files.items():
        with open(os.path.join(out_dir, name), "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
    tok = _tokenizer(out_dir)
    # The tokenizer writes its own config.json; it keeps the real checkpoint's quantization section
    # (ModelOpt NVFP4), which is what vLLM reads to pick the NVFP4 kernels.
    with open(os.path.join(out_dir, "config.json")) as fh:
        config = json.load(fh)
    if "quantization_config" not in config:
        config["quantization_config"] = _config()["quantization_config"]
        with open(os.path.join(out_dir, "config.json"), "w") as fh:
            json.dump(config, fh, indent=2, sort_keys=True)
            fh.write("\n")
    entries = []
    for rel in model_manifest.scan_dir(out_dir):
        full = os.path.join(out_dir, rel)
        entries.append({"path": rel, "size": os.path.getsize(full),
                        "sha256": digests.get(rel) or model_hashing.sha256_file(full)})
    # A Hub-like revision (40 hex, like a git commit) derived from the content, so it is stable.
    digest = model_manifest.manifest_digest(model_manifest.make_manifest("0" * 40, entries))
    revision = hashlib.sha1(digest.encode()).hexdigest()
    manifest = model_manifest.make_manifest(revision, entries, source="hf://%s@%s" % (REPO_ID, revision))
    model_manifest.write_json_atomic(os.path.join(out_dir, model_manifest.MANIFEST_NAME), manifest)
    return {"revision": revision, "manifest_digest": model_manifest.manifest_digest(manifest),
            "size": model_manifest.total_size(manifest), "files": len(entries), "tokenizer": tok}


def _git_blob_id(path):
    return model_hashing.git_blob_sha1(path)


class HubStub:
    """Serve a built synthetic model as Hub repo `repo_id` at one revision (and branch `main`).

    Counts bytes served, so a test can prove the external source was read once.
    `token`, when set, is required as `Authorization: Bearer <token>` (401 otherwise).
    """

    def __init__(self, root, repo_id=REPO_ID, token=None, host="127.0.0.1", port=0, page_size=3):
        with open(os.path.join(root, ".pdctl-manifest.json")) as fh:
            self.manifest = json.load(fh)
        self.root, self.repo_id, self.token, self.page_size = root, repo_id, token, page_size
        self.revision = self.manifest["revision"]
        self.bytes_served = 0
        self.requests = []
        self._lock = threading.Lock()
        self.entries = []
        for f in self.manifest["files"]:
            if f["path"].endswith(".safetensors"):
                self.entries.append({"type": "file", "path": f["path"], "size": f["size"],
                                     "oid": hashlib.sha1(f["path"].encode()).hexdigest(),
                                     "lfs": {"oid": f["sha256"], "size": f["size"], "pointerSize": 134}})
            else:
                self.entries.append({"type": "file", "path": f["path"], "size": f["size"],
                                     "oid": _git_blob_id(os.path.join(root, f["path"]))})
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                stub._handle(self)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://%s:%d" % (host, self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def _json(self, h, code, data, headers=None):
        body = json.dumps(data).encode()
        h.send_response(code)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _rev_ok(self, rev):
        return rev in (self.revision, "main")

    def _handle(self, h):
        parts = urlsplit(h.path)
        path = unquote(parts.path)
        with self._lock:
            self.requests.append({"path": path, "authorization": h.headers.get("Authorization")})
        if self.token and h.headers.get("Authorization") != "Bearer %s" % self.token:
            return self._json(h, 401, {"error": "Invalid credentials"}, {"X-Error-Code": "RepoNotFound"})
        api = "/api/models/%s/" % self.repo_id
        m = re.match(re.escape(api) + r"revision/([^/]+)$", path)
        if m:
            if not self._rev_ok(m.group(1)):
                return self._json(h, 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"})
            return self._json(h, 200, {"id": self.repo_id, "sha": self.revision})
        m = re.match(re.escape(api) + r"tree/([^/]+)/?$", path)
        if m:
            if not self._rev_ok(m.group(1)):
                return self._json(h, 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"})
            start = int(parse_qs(parts.query).get("cursor", ["0"])[0])
            page = self.entries[start:start + self.page_size]
            headers = {}
            if start + self.page_size < len(self.entries):
                headers["Link"] = '<%s%s?recursive=true&cursor=%d>; rel="next"' % (
                    self.url, parts.path, start + self.page_size)
            return self._json(h, 200, page, headers)
        m = re.match(r"/%s/resolve/([^/]+)/(.+)$" % re.escape(self.repo_id), path)
        if m and self._rev_ok(m.group(1)) and any(e["path"] == m.group(2) for e in self.entries):
            return self._file(h, m.group(2))
        return self._json(h, 404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})

    def _file(self, h, rel):
        full = os.path.join(self.root, rel)
        size = os.path.getsize(full)
        start = 0
        m = re.match(r"bytes=(\d+)-$", h.headers.get("Range", ""))
        if m:
            start = int(m.group(1))
            h.send_response(206)
            h.send_header("Content-Range", "bytes %d-%d/%d" % (start, size - 1, size))
        else:
            h.send_response(200)
        h.send_header("Content-Length", str(size - start))
        h.send_header("X-Repo-Commit", self.revision)
        h.end_headers()
        with open(full, "rb") as fh:
            sent = h.connection.sendfile(fh, start, size - start)
        with self._lock:
            self.bytes_served += sent


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(description="build the lab's synthetic GLM-5.2-NVFP4")
    p.add_argument("out_dir")
    p.add_argument("--size-mb", type=int, default=1536)
    p.add_argument("--serve-hub", metavar="PORT", type=int, help="then serve it as a Hub stub on PORT")
    args = p.parse_args(argv)
    info = build(args.out_dir, size_mb=args.size_mb)
    print(json.dumps(info, indent=1))
    if args.serve_hub is not None:
        with HubStub(args.out_dir, host="0.0.0.0", port=args.serve_hub) as stub:
            print("serving %s at %s (revision %s)" % (REPO_ID, stub.url, stub.revision), flush=True)
            stub._thread.join()


if __name__ == "__main__":
    main()
