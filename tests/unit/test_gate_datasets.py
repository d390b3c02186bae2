"""Data staging (Hub file API and local directory), sampling, and GPQA privacy (plugin_utils.gates.datasets)."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import httpx
import pytest

from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import answer_key, datasets

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "gates" / "datasets"
REV = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_gateTEST0123456789secret"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def hub(files: dict, seen: list):
    """A Hub stand-in serving {url path: bytes}; gated: 401 without the token."""
    def handler(request: httpx.Request):
        seen.append(request)
        if request.headers.get("authorization") != "Bearer " + TOKEN:
            return httpx.Response(401)
        body = files.get(request.url.path)
        return httpx.Response(200, content=body) if body is not None else httpx.Response(404)
    return httpx.Client(transport=httpx.MockTransport(handler))


def test_hub_download_pinned_revision_with_token(tmp_path):
    csv = DATA / "Idavidrein" / "gpqa" / "gpqa_diamond.csv"
    seen = []
    client = hub({"/datasets/Idavidrein/gpqa/resolve/%s/gpqa_diamond.csv" % REV: csv.read_bytes()}, seen)
    source = {"repo_id": "Idavidrein/gpqa", "revision": REV, "files": {"gpqa_diamond.csv": _sha(csv)}}
    staged = datasets.stage("gpqa", source, cache_dir=tmp_path, token=TOKEN, client=client)
    assert staged["gpqa_diamond.csv"]["sha256"] == _sha(csv)
    assert str(seen[0].url) == "https://huggingface.co/datasets/Idavidrein/gpqa/resolve/%s/gpqa_diamond.csv" % REV
    # cached: no second request
    datasets.stage("gpqa", source, cache_dir=tmp_path, token=TOKEN, client=client)
    assert len(seen) == 1


def test_hub_refusals_never_show_the_token(tmp_path):
    csv = DATA / "Idavidrein" / "gpqa" / "gpqa_diamond.csv"
    client = hub({}, [])
    source = {"repo_id": "Idavidrein/gpqa", "revision": REV, "files": {"gpqa_diamond.csv": _sha(csv)}}
    with pytest.raises(datasets.DatasetError, match="gated data set") as exc:
        datasets.stage("gpqa", source, cache_dir=tmp_path, token="wrong" + TOKEN, client=client)
    assert TOKEN not in str(exc.value)
    with pytest.raises(datasets.DatasetError, match="pinned 40-hex"):
        datasets.stage("gpqa", dict(source, revision="main"), cache_dir=tmp_path, client=client)
    with pytest.raises(datasets.DatasetError, match="no sha256 pin"):
        datasets.stage("gpqa", dict(source, files=["gpqa_diamond.csv"]), cache_dir=tmp_path, client=client)


def test_hub_content_mismatch_is_refused(tmp_path):
    seen = []
    client = hub({"/datasets/zai-org/LongBench-v2/resolve/%s/data.json" % REV: b"[]"}, seen)
    source = {"repo_id": "zai-org/LongBench-v2", "revision": REV, "files": {"data.json": "0" * 64}}
    with pytest.raises(datasets.DatasetError, match="expected 0000"):
        datasets.stage("longbench", source, cache_dir=tmp_path, token=TOKEN, client=client)


def test_local_dir_checks_pins(tmp_path):
    shutil.copytree(DATA, tmp_path / "d")
    path = tmp_path / "d" / "opencompass" / "AIME2025" / "aime2025-I.jsonl"
    source = {"files": {"aime2025-I.jsonl": _sha(path)}}
    assert datasets.stage("aime", source, local_dir=tmp_path / "d")
    path.write_text(path.read_text() + "\n")
    with pytest.raises(datasets.DatasetError, match="sha256"):
        datasets.stage("aime", source, local_dir=tmp_path / "d")
    with pytest.raises(datasets.DatasetError, match="not found"):
        datasets.stage("aime", {"files": ["nope.jsonl"]}, local_dir=tmp_path / "d")


def test_sampling_is_deterministic_and_sized():
    gpqa, prov = datasets.load_benchmark("gpqa", {}, {"samples": 64}, 11, local_dir=DATA)
    again, _ = datasets.load_benchmark("gpqa", {}, {"samples": 64}, 11, local_dir=DATA)
    other, _ = datasets.load_benchmark("gpqa", {}, {"samples": 64}, 12, local_dir=DATA)
    assert len(gpqa) == 64 and [i.id for i in gpqa] == [i.id for i in again]
    assert [i.id for i in gpqa] != [i.id for i in other]
    assert prov["items"] == 64 and prov["revision"] is None and "gpqa_diamond.csv" in prov["files"]
    aime, _ = datasets.load_benchmark("aime", {}, {"samples": None}, 11, local_dir=DATA)
    assert len(aime) == 30 and all(int(i.answer) >= 0 for i in aime)
    lb, _ = datasets.load_benchmark("longbench", {}, {"buckets": {"short": 3, "long": 2}}, 11, local_dir=DATA)
    assert [i.meta["length"] for i in lb] == ["short"] * 3 + ["long"] * 2
    assert all(i.prompt.startswith("Please read the following text") for i in lb)
    with pytest.raises(datasets.DatasetError, match="13 requested"):
        datasets.load_benchmark("longbench", {}, {"buckets": {"short": 13}}, 11, local_dir=DATA)


def test_gpqa_items_are_private_and_the_answer_key_holds_no_item_text():
    items, _ = datasets.load_benchmark("gpqa", {}, {"samples": 5}, 3, local_dir=DATA)
    assert all(not i.public and len(i.meta["question_sha256"]) == 16 for i in items)
    key = json.dumps(answer_key.build(items))
    assert "Synthetic item" not in key and "squared" not in key


def test_answer_key_contract():
    items, _ = datasets.load_benchmark("aime", {}, {}, 3, local_dir=DATA)
    key = answer_key.build(items, 0.9)
    assert key["correct_rate"] == 0.9
    sha = items[0].prompt_sha256
    assert sha == hashlib.sha256(items[0].prompt.encode("utf-8")).hexdigest()
    entry = key["entries"][sha]
    assert {"correct", "wrong"} <= set(entry)
    from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import prompts
    assert prompts.aime_correct(prompts.aime_extract(entry["correct"]), items[0].answer)
    assert not prompts.aime_correct(prompts.aime_extract(entry["wrong"]), items[0].answer)
    assert answer_key.predicted_correct("00000000" + "0" * 56, 0.5)
    assert not answer_key.predicted_correct("ffffffff" + "0" * 56, 0.5)
