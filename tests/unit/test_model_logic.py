"""module_utils/model*.py and the lab synthetic model: small files in tmp dirs."""
from __future__ import annotations

import json
import os
import struct
import threading
import urllib.request

import pytest

from pdctl.lab import synthetic_model as sm
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import model as pdm, model_fill, model_hashing, model_manifest, model_sources

SIZE_MB = 2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two revisions of the synthetic model (different seeds) as mirror dirs."""
    base = tmp_path_factory.mktemp("models")
    a = sm.build(str(base / "a"), size_mb=SIZE_MB, shards=3, seed=1)
    b = sm.build(str(base / "b"), size_mb=SIZE_MB, shards=3, seed=2)
    return {"a": (str(base / "a"), a), "b": (str(base / "b"), b)}


def copy_tree(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return str(dst)


def served(tmp_path):
    return str(tmp_path / "mnt" / "GLM-5.2-NVFP4")


def test_synthetic_model_is_deterministic_and_valid(models, tmp_path):
    root, info = models["a"]
    again = sm.build(str(tmp_path / "again"), size_mb=SIZE_MB, shards=3, seed=1)
    assert again["revision"] == info["revision"] and again["manifest_digest"] == info["manifest_digest"]
    assert len(info["revision"]) == 40
    config = json.load(open(os.path.join(root, "config.json")))
    assert config["model_type"] == "glm_moe_dsa" and config["architectures"] == ["GlmMoeDsaForCausalLM"]
    index = json.load(open(os.path.join(root, "model.safetensors.index.json")))
    total = 0
    for shard in sorted(set(index["weight_map"].values())):
        with open(os.path.join(root, shard), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
            data = os.path.getsize(os.path.join(root, shard)) - 8 - n
        ends = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
        assert ends[0][0] == 0 and ends[-1][1] == data          # tensors cover the payload exactly
        total += data
    assert index["metadata"]["total_size"] == total


def test_sync_from_mirror_then_noop_reads_nothing(models, tmp_path, monkeypatch):
    root, info = models["a"]
    path = served(tmp_path)
    r = pdm.sync(path, root, info["revision"])
    assert r["changed"] and r["action"] == "filled" and r["bytes_from_source"] == info["size"]
    assert os.path.islink(path) and os.readlink(path) == ".GLM-5.2-NVFP4.versions/%s" % info["revision"]
    assert r["manifest_digest"] == info["manifest_digest"]
    # Second run: decided from the marker alone; hashing a single byte would fail the test.
    monkeypatch.setattr(model_hashing, "sha256_file", lambda *a, **k: pytest.fail("no-op run hashed a file"))
    r2 = pdm.sync(path, root, info["revision"])
    assert not r2["changed"] and r2["action"] == "current" and r2["bytes_from_source"] == 0
    log = [json.loads(line) for line in open(pdm.Layout(path).transfer_log)]
    assert [rec["bytes_from_source"] for rec in log] == [info["size"]]


def test_flipped_byte_in_source_is_named_and_service_untouched(models, tmp_path):
    (ra, a), (rb, b) = models["a"], models["b"]
    path = served(tmp_path)
    pdm.sync(path, ra, a["revision"])
    bad = copy_tree(rb, tmp_path / "bad")
    shard = "model-00002-of-00003.safetensors"
    with open(os.path.join(bad, shard), "r+b") as fh:
        fh.seek(100000)
        byte = fh.read(1)
        fh.seek(100000)
        fh.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(pdm.ModelError) as err:
        pdm.sync(path, bad, b["revision"])
    assert any(p.startswith(shard + ": sha256 expected ") for p in err.value.problems)
    assert "served path was not changed" in str(err.value)
    assert pdm.Layout(path).current() == a["revision"]
    assert pdm.status(path, a["revision"], full=True)["verified"]
    # The bad file is dropped from staging, so a run against a repaired source fetches it again.
    r = pdm.sync(path, rb, b["revision"])
    assert r["files_to_fetch"] == [shard] and pdm.Layout(path).current() == b["revision"]


def test_missing_shard_is_named(models, tmp_path):
    rb, b = models["b"]
    src = copy_tree(rb, tmp_path / "src")
    os.unlink(os.path.join(src, "model-00003-of-00003.safetensors"))
    with pytest.raises(pdm.ModelError, match=r"model-00003-of-00003.safetensors: missing from source"):
        pdm.sync(served(tmp_path), src, b["revision"])
    assert pdm.Layout(served(tmp_path)).current() is None


def test_wrong_revision_fails_before_copying(models, tmp_path):
    ra, a = models["a"]
    with pytest.raises(pdm.ModelError, match="holds revision %s, expected deadbeef" % a["revision"]):
        pdm.sync(served(tmp_path), ra, "deadbeef")
    assert not os.path.exists(pdm.Layout(served(tmp_path)).versions)
    with sm.HubStub(ra) as hub:
        with pytest.raises(pdm.ModelError, match="revision %s not found in Hub repo" % ("1" * 40)):
            pdm.sync(served(tmp_path), "hf://" + sm.REPO_ID, "1" * 40, hub_endpoint=hub.url)
        assert hub.bytes_served == 0


def test_not_enough_disk_fails_before_copying(models, tmp_path, monkeypatch):
    ra, a = models["a"]
    monkeypatch.setattr(model_fill, "free_bytes", lambda path: a["size"])    # < size + 10% margin
    with pytest.raises(pdm.ModelError, match=r"not enough free space .* \(0.00 GiB to fetch \+ 10% margin\)"):
        pdm.sync(served(tmp_path), ra, a["revision"])
    lay = pdm.Layout(served(tmp_path))
    assert not os.path.exists(lay.staging_dir(a["revision"])) and lay.current() is None


class Flaky:
    """A source that breaks after `limit` bytes, counting what it hands out."""

    def __init__(self, inner, limit):
        self.inner, self.limit, self.read = inner, limit, 0
        self.label = inner.label

    def manifest(self, revision):
        return self.inner.manifest(revision)

    def open(self, rel, offset):
        fh, start = self.inner.open(rel, offset)
        outer = self

        class Stream:
            def __enter__(self):
                return self

            def __exit__(self, *a):
                fh.close()

            def readinto(self, buf):
                if outer.read >= outer.limit:
                    raise ConnectionResetError("link dropped")
                n = fh.readinto(memoryview(buf)[:min(len(buf), outer.limit - outer.read)])
                outer.read += n
                return n
        return Stream(), start


def test_interrupted_copy_resumes_without_rereading(models, tmp_path, monkeypatch):
    ra, a = models["a"]
    path = served(tmp_path)
    cut = a["size"] // 2 + 12345
    flaky = Flaky(model_sources.DirSource(ra), cut)
    monkeypatch.setattr(model_fill, "open_source", lambda *args, **kw: flaky)
    with pytest.raises(pdm.ModelError, match="interrupted after %d bytes.*run again to resume" % cut):
        pdm.sync(path, ra, a["revision"], jobs=1)
    assert pdm.Layout(path).current() is None
    counting = Flaky(model_sources.DirSource(ra), 1 << 40)
    monkeypatch.setattr(model_fill, "open_source", lambda *args, **kw: counting)
    r = pdm.sync(path, ra, a["revision"], jobs=1)
    assert r["bytes_from_source"] == counting.read == a["size"] - cut
    assert pdm.status(path, a["revision"], full=True)["verified"]


def test_damaged_served_file_detected_by_full_verify_and_repaired(models, tmp_path):
    ra, a = models["a"]
    path = served(tmp_path)
    pdm.sync(path, ra, a["revision"])
    shard = os.path.join(path, "model-00001-of-00003.safetensors")
    st = os.stat(shard)
    with open(shard, "r+b") as fh:
        fh.seek(5000)
        fh.write(b"\0")
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert pdm.status(path, a["revision"])["checked"] == "fast"          # size+mtime cannot see it
    full = pdm.status(path, a["revision"], full=True)
    assert not full["verified"]
    assert full["problems"][0].startswith("model-00001-of-00003.safetensors: sha256 expected ")
    os.utime(shard)                                                        # now the fast check notices
    r = pdm.sync(path, ra, a["revision"])
    assert r["action"] == "repaired" and r["bytes_from_source"] == st.st_size
    assert pdm.status(path, a["revision"], full=True)["verified"]


def test_new_revision_hardlinks_unchanged_files(models, tmp_path):
    ra, a = models["a"]
    path = served(tmp_path)
    pdm.sync(path, ra, a["revision"])
    # Same shards, new generation_config.json: a config-only revision.
    src = copy_tree(ra, tmp_path / "v2")
    with open(os.path.join(src, "generation_config.json"), "w") as fh:
        fh.write('{"temperature": 0.7}\n')
    os.unlink(os.path.join(src, model_manifest.MANIFEST_NAME))
    man = model_hashing.build_manifest(src, "v2")
    model_manifest.write_json_atomic(os.path.join(src, model_manifest.MANIFEST_NAME), man)
    r = pdm.sync(path, src, "v2")
    assert r["bytes_from_source"] == os.path.getsize(os.path.join(src, "generation_config.json"))
    assert pdm.status(path, "v2", full=True)["verified"]


def test_fanout_server_serves_ranges_and_stops_on_nonce(models, tmp_path):
    ra, a = models["a"]
    seed = str(tmp_path / "seed" / "GLM")
    pdm.sync(seed, ra, a["revision"])
    ready = threading.Event()
    box = {}

    def run():
        box["result"] = pdm.serve(seed, a["revision"], bind="127.0.0.1", port=0, nonce="n0nce",
                                  ready=lambda srv: (box.update(port=srv.server_address[1]), ready.set()))
    t = threading.Thread(target=run)
    t.start()
    assert ready.wait(10)
    url = "http://127.0.0.1:%d/" % box["port"]
    # A receiver that already holds part of a shard continues from there.
    lay = pdm.Layout(str(tmp_path / "recv" / "GLM"))
    staging = lay.staging_dir(a["revision"])
    os.makedirs(staging)
    shard = "model-00001-of-00003.safetensors"
    with open(os.path.join(ra, shard), "rb") as fh, open(os.path.join(staging, shard), "wb") as out:
        out.write(fh.read(300000))
    r = pdm.sync(lay.served, url, a["revision"], expected_digest=a["manifest_digest"])
    assert r["bytes_from_source"] == a["size"] - 300000
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(url + "../etc/passwd")
    urllib.request.urlopen(urllib.request.Request(url + ".pdctl/shutdown/n0nce", method="POST"))
    t.join(10)
    assert box["result"]["stopped"] == "shutdown"
    assert box["result"]["bytes_sent"] == a["size"] - 300000


def test_fanout_rejects_other_content(models, tmp_path):
    ra, a = models["a"]
    seed = str(tmp_path / "seed" / "GLM")
    pdm.sync(seed, ra, a["revision"])
    with pytest.raises(pdm.ModelError, match="manifest digest .* expected 00"):
        pdm.sync(str(tmp_path / "r" / "GLM"), ra, a["revision"], expected_digest="00")


def test_hub_source_uses_lfs_metadata_token_and_pagination(models, tmp_path):
    ra, a = models["a"]
    with sm.HubStub(ra, token="hf_TESTSECRET", page_size=2) as hub:
        src = model_sources.HubSource(sm.REPO_ID, "main", token="hf_TESTSECRET", endpoint=hub.url)
        man = src.manifest("main")
        assert man["revision"] == a["revision"]                           # branch resolved to the commit
        shards = [f for f in man["files"] if f["path"].endswith(".safetensors")]
        assert all(len(f["sha256"]) == 64 for f in shards)
        assert all("git_oid" in f for f in man["files"] if f not in shards)
        assert len(man["files"]) == a["files"]                            # every tree page followed
        with pytest.raises(pdm.ModelError, match="token lacks access"):
            model_sources.HubSource(sm.REPO_ID, a["revision"], endpoint=hub.url).manifest(a["revision"])
        r = pdm.sync(served(tmp_path), "hf://" + sm.REPO_ID, a["revision"], token="hf_TESTSECRET",
                     hub_endpoint=hub.url)
        assert r["bytes_from_source"] == hub.bytes_served == a["size"]
        assert r["manifest_digest"] == a["manifest_digest"]
        assert "hf_TESTSECRET" not in json.dumps(r)


def test_check_mode_writes_nothing(models, tmp_path):
    ra, a = models["a"]
    r = pdm.sync(served(tmp_path), ra, a["revision"], check_mode=True)
    assert r["changed"] and r["action"] == "would_fill" and r["bytes_to_fetch"] == a["size"]
    assert not os.path.exists(tmp_path / "mnt")


def test_served_path_that_is_a_real_directory_is_refused(models, tmp_path):
    ra, a = models["a"]
    os.makedirs(served(tmp_path))
    with pytest.raises(pdm.ModelError, match="is not a symlink managed by pdctl"):
        pdm.sync(served(tmp_path), ra, a["revision"])


def test_manifest_rejects_escaping_paths():
    with pytest.raises(pdm.ModelError, match="escapes"):
        model_manifest.make_manifest("r1", [{"path": "../x", "size": 1, "sha256": "00"}])
    with pytest.raises(pdm.ModelError, match="not usable as a directory name"):
        model_manifest.check_revision("../../etc")


def test_token_is_not_forwarded_on_redirect(models, tmp_path):
    """The Hub redirects LFS downloads to a CDN host: the bearer token must stay with the Hub."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    seen = []

    class Cdn(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", "3")
            self.end_headers()
            self.wfile.write(b"abc")

    cdn = ThreadingHTTPServer(("127.0.0.1", 0), Cdn)

    class Hub(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.1:%d/blob" % cdn.server_address[1])
            self.send_header("Content-Length", "0")
            self.end_headers()

    hub = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    for srv in (cdn, hub):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        src = model_sources.HttpSource("http://127.0.0.1:%d/r/" % hub.server_address[1], {"Authorization": "Bearer hf_X"})
        stream, start = src.open("f.bin", 0)
        assert stream.read() == b"abc" and start == 0
        assert seen == ["Bearer hf_X", None]
    finally:
        for srv in (cdn, hub):
            srv.shutdown()
            srv.server_close()
