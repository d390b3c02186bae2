# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""model_sync and model_verify run in-process: arguments through patch_module_args, exit_json/fail_json
raising (community.general's tests/unit/plugins/modules/utils.py pattern)."""
from __future__ import annotations

import os

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import model_hashing, model_manifest
from ansible_collections.pdctl.vllm_pd.plugins.modules import model_sync, model_verify


class Exit(Exception):
    pass


class Fail(Exception):
    pass


@pytest.fixture(autouse=True)
def raising_exits(monkeypatch):
    def exit_json(self, **kwargs):
        raise Exit(kwargs)

    def fail_json(self, **kwargs):
        raise Fail(kwargs)
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)


def run(module, args, check_mode=False):
    if check_mode:
        args = dict(args, _ansible_check_mode=True)
    with patch_module_args(args), pytest.raises((Exit, Fail)) as exc:
        module.main()
    return exc.type is Fail, exc.value.args[0]


@pytest.fixture
def mirror(tmp_path):
    """A mirror directory of revision r1 with its .pdctl-manifest.json."""
    root = tmp_path / "mirror"
    os.makedirs(root / "sub")
    for rel, size in (("model-00001.safetensors", 300000), ("sub/config.json", 20)):
        with open(root / rel, "wb") as fh:
            fh.write(os.urandom(size))
    manifest = model_hashing.build_manifest(str(root), "r1")
    model_manifest.write_json_atomic(str(root / model_manifest.MANIFEST_NAME), manifest)
    return str(root), manifest


def test_sync_fills_then_is_a_no_op_and_verify_agrees(mirror, tmp_path):
    root, manifest = mirror
    path = str(tmp_path / "mnt" / "GLM")
    args = {"path": path, "source": root, "revision": "r1"}
    failed, res = run(model_sync, args, check_mode=True)
    assert not failed and res["changed"] and res["action"] == "would_fill"
    assert res["bytes_to_fetch"] == model_manifest.total_size(manifest)
    assert not os.path.exists(tmp_path / "mnt")
    failed, res = run(model_sync, args)
    assert not failed and res["action"] == "filled" and res["diff"]["after"] == "revision: r1\n"
    assert res["manifest_digest"] == model_manifest.manifest_digest(manifest)
    failed, res = run(model_sync, args)
    assert not failed and not res["changed"] and res["bytes_from_source"] == 0
    failed, res = run(model_verify, {"path": path, "full": True})
    assert not failed and res["verified"] and res["checked"] == "full"


def test_verify_fails_naming_the_damaged_file(mirror, tmp_path):
    root, manifest = mirror
    path = str(tmp_path / "GLM")
    assert not run(model_sync, {"path": path, "source": root, "revision": "r1"})[0]
    shard = os.path.join(path, "model-00001.safetensors")
    os.chmod(shard, 0o644)
    with open(shard, "r+b") as fh:
        fh.write(b"\0" * 16)
    failed, res = run(model_verify, {"path": path, "revision": "r1", "full": True})
    assert failed and not res["verified"]
    assert res["problems"] == ["model-00001.safetensors: sha256 expected %s, found %s"
                               % (manifest["files"][0]["sha256"], model_hashing.sha256_file(shard))]
    failed, res = run(model_verify, {"path": path, "revision": "r1", "full": True, "fail_on_mismatch": False})
    assert not failed and not res["verified"]


def test_sync_from_a_mirror_of_another_revision_fails(mirror, tmp_path):
    root, dummy = mirror
    failed, res = run(model_sync, {"path": str(tmp_path / "GLM"), "source": root, "revision": "r2"})
    assert failed and "holds revision r1, expected r2" in res["msg"]
    assert not os.path.exists(tmp_path / "GLM")


def test_token_is_no_log_and_falls_back_to_hf_token(monkeypatch):
    spec = {}
    monkeypatch.setattr(basic.AnsibleModule, "__init__", lambda self, **kw: spec.update(kw["argument_spec"]))
    model_sync.build_module()
    assert spec["token"]["no_log"] is True and spec["token"]["fallback"][1] == ["HF_TOKEN"]
