"""library/model_*.py run in-process with ansible-core's patch_module_args."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from module_harness import run

from pdctl import collection
from pdctl.lab import synthetic_model as sm

ROOT = collection.root()

MODULES = ("model_sync", "model_verify", "model_serve")
TOKEN = "hf_pdctlTEST0123456789secretTOKEN"






@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("m") / "src")
    return root, sm.build(root, size_mb=1, shards=2, seed=7)




def test_sync_with_token_never_leaks_it(model, tmp_path, capsys):
    root, info = model
    path = str(tmp_path / "mnt" / "GLM")
    with sm.HubStub(root, token=TOKEN) as hub:
        args = {"path": path, "source": "hf://" + sm.REPO_ID, "revision": info["revision"], "token": TOKEN,
                "hub_endpoint": hub.url}
        failed, res, out = run("model_sync", args, capsys, check_mode=True)
        assert not failed and res["changed"] and res["action"] == "would_fill"
        assert not os.path.exists(tmp_path / "mnt")
        outputs = [out]
        failed, res, out = run("model_sync", args, capsys)
        assert not failed and res["action"] == "filled" and res["bytes_from_source"] == info["size"]
        assert res["diff"]["after"] == "revision: %s\n" % info["revision"]
        outputs.append(out)
        failed, res, out = run("model_sync", args, capsys)
        assert not failed and not res["changed"]
        outputs.append(out)
        # Failing runs too: the error path must not echo it either.
        failed, res, out = run("model_sync", dict(args, revision="2" * 40, path=str(tmp_path / "o" / "G")), capsys)
        assert failed and "not found in Hub repo" in res["msg"]
        outputs.append(out)
        assert all(r["authorization"] == "Bearer " + TOKEN for r in hub.requests)   # it was really used
    for text in outputs:
        assert TOKEN not in text
    for dirpath, _, files in os.walk(tmp_path):
        for f in files:
            assert TOKEN.encode() not in Path(dirpath, f).read_bytes(), f


def test_sync_token_from_environment(model, tmp_path, capsys, monkeypatch):
    root, info = model
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with sm.HubStub(root, token=TOKEN) as hub:
        failed, res, out = run("model_sync", {"path": str(tmp_path / "G"), "source": "hf://" + sm.REPO_ID,
                                              "revision": info["revision"], "hub_endpoint": hub.url}, capsys)
    assert not failed and TOKEN not in out


def test_verify_names_the_damaged_file(model, tmp_path, capsys):
    root, info = model
    path = str(tmp_path / "G")
    failed, res, _ = run("model_sync", {"path": path, "source": root, "revision": info["revision"]}, capsys)
    assert not failed
    failed, res, _ = run("model_verify", {"path": path}, capsys)
    assert not failed and res["verified"] and res["checked"] == "fast" and not res["changed"]
    shard = os.path.join(path, "model-00002-of-00002.safetensors")
    with open(shard, "r+b") as fh:
        fh.seek(0, 2)
        fh.write(b"x")
    failed, res, _ = run("model_verify", {"path": path, "revision": info["revision"]}, capsys)
    assert failed
    assert "model-00002-of-00002.safetensors: expected %d bytes, found %d" % (
        os.path.getsize(shard) - 1, os.path.getsize(shard)) in res["msg"]
    failed, res, _ = run("model_verify", {"path": path, "revision": "other"}, capsys)
    assert failed and "shows revision %s, expected other" % info["revision"] in res["msg"]


def test_sync_failure_names_file_expected_and_found(model, tmp_path, capsys):
    root, info = model
    src = tmp_path / "src"
    import shutil
    shutil.copytree(root, src)
    with open(src / "config.json", "a") as fh:
        fh.write(" ")
    failed, res, _ = run("model_sync", {"path": str(tmp_path / "G"), "source": str(src),
                                        "revision": info["revision"]}, capsys)
    assert failed and res["problems"][0].startswith("config.json: expected ")
    assert "failed verification; the served path was not changed" in res["msg"]


def test_serve_check_mode_starts_nothing(model, tmp_path, capsys):
    _, info = model
    failed, res, _ = run("model_serve", {"path": str(tmp_path / "G"), "revision": info["revision"], "port": 1,
                                         "nonce": "x"}, capsys, check_mode=True)
    assert not failed and res["stopped"] == "not_started" and not res["changed"]


def test_serve_needs_the_planned_port(model, tmp_path, capsys):
    # No port of its own: the model_weights role passes pdctl_ports.model_fanout.
    _, info = model
    failed, res, _ = run("model_serve", {"path": str(tmp_path / "G"), "revision": info["revision"], "nonce": "x"},
                         capsys, check_mode=True)
    assert failed and "missing required arguments: port" in res["msg"]


def test_serve_refuses_unverified(model, tmp_path, capsys):
    _, info = model
    failed, res, _ = run("model_serve", {"path": str(tmp_path / "G"), "revision": info["revision"],
                                         "bind": "127.0.0.1", "port": 0}, capsys)
    assert failed and "is not the verified current version" in res["msg"]
