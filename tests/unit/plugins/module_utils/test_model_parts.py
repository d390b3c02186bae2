# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The model_* module_utils on small trees in tmp dirs (run by `ansible-test units` and by pytest)."""
from __future__ import annotations

import os

import pytest

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import model, model_hashing, model_manifest
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model_manifest import ModelError


def tree(root, files):
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
    return str(root)


def test_facade_is_the_operations_the_modules_call():
    assert sorted(model.__all__) == ["Layout", "ModelError", "prune", "serve", "status", "sync"]
    assert model.ModelError is model_manifest.ModelError


def test_manifest_is_sorted_and_its_digest_ignores_the_source():
    a = model_manifest.make_manifest("r1", [{"path": "b", "size": 1, "sha256": "AA"}, {"path": "a", "size": 2}],
                                     source="x")
    b = model_manifest.make_manifest("r1", [{"path": "a", "size": 2}, {"path": "b", "size": 1, "sha256": "aa"}])
    assert [f["path"] for f in a["files"]] == ["a", "b"] and a["files"][1]["sha256"] == "aa"
    assert model_manifest.manifest_digest(a) == model_manifest.manifest_digest(b)
    assert model_manifest.total_size(a) == 3


@pytest.mark.parametrize("rel", ["../x", "/etc/passwd", "a/./b", "a//b"])
def test_manifest_paths_stay_inside_the_model(rel):
    with pytest.raises(ModelError, match="escapes"):
        model_manifest.make_manifest("r1", [{"path": rel, "size": 1}])


def test_revision_must_be_a_directory_name():
    with pytest.raises(ModelError, match="not usable as a directory name"):
        model_manifest.check_revision("../r")


def test_verify_tree_names_each_wrong_file(tmp_path):
    root = tree(tmp_path / "m", {"a.bin": b"a" * 100, "sub/b.bin": b"b" * 10, ".hidden": b"not content"})
    manifest = model_hashing.build_manifest(root, "r1", workers=2)
    assert [f["path"] for f in manifest["files"]] == ["a.bin", "sub/b.bin"]
    assert model_hashing.verify_tree(root, manifest) == []
    tree(root, {"a.bin": b"x" * 100, "sub/b.bin": b"short", "extra.bin": b"?"})
    problems = model_hashing.verify_tree(root, manifest)
    assert problems[0].startswith("a.bin: sha256 expected %s, found " % manifest["files"][0]["sha256"])
    assert "extra.bin: not in the manifest of revision r1" in problems
    assert "sub/b.bin: expected 10 bytes, found 5" in problems


def test_layout_of_a_served_path(tmp_path):
    lay = model.Layout(str(tmp_path / "GLM"))
    assert lay.versions == str(tmp_path / ".GLM.versions")
    assert lay.staging_dir("r1") == str(tmp_path / ".GLM.versions" / "r1.partial")
    assert lay.current() is None
    os.makedirs(lay.served)
    with pytest.raises(ModelError, match="is not a symlink managed by pdctl"):
        lay.current()
