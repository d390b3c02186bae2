"""Stage the accuracy data sets and turn them into graded items.

Sources, per data set:
- the Hugging Face Hub at a pinned revision (``repo_id`` + 40-hex ``revision`` + optional token), over its
  plain file API ``{endpoint}/datasets/{repo_id}/resolve/{revision}/{path}`` with ``Authorization: Bearer``;
- a local directory (air-gapped sites) holding the same files at ``{local_dir}/{repo_id}/{path}``.
Every file is checked against its pinned sha256; a Hub download without a pin is refused.
The token is never logged, printed or written to a report.

GPQA Diamond is gated and its authors ask that items never appear in plain text online: items are kept in
memory only; reports and per-item results carry the record id and a hash of the question, never its text.

Formats (as published):
- AIME 2025: JSON lines (or a JSON list), fields ``question`` or ``problem``, ``answer`` (integer), ``id`` optional.
- GPQA Diamond: ``gpqa_diamond.csv`` with ``Record ID``, ``Question``, ``Correct Answer``,
  ``Incorrect Answer 1`` .. ``Incorrect Answer 3``.
- LongBench v2: ``data.json``, a list of {``_id``, ``domain``, ``difficulty``, ``length`` (short/medium/long),
  ``question``, ``choice_A`` .. ``choice_D``, ``answer``, ``context``}.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import prompts

HUB_ENDPOINT = "https://huggingface.co"
BENCHMARKS = ("aime", "gpqa", "longbench")

# Where each data set lives on the Hub. Revisions and sha256 pins are site configuration
# (pdctl_gate_accuracy.datasets in the inventory); these defaults only name the repository and files.
DEFAULT_SOURCES = {
    "aime": {"repo_id": "opencompass/AIME2025", "files": ["aime2025-I.jsonl", "aime2025-II.jsonl"]},
    "gpqa": {"repo_id": "Idavidrein/gpqa", "files": ["gpqa_diamond.csv"]},
    "longbench": {"repo_id": "zai-org/LongBench-v2", "files": ["data.json"]},
}


class DatasetError(Exception):
    pass


@dataclass
class Item:
    benchmark: str
    id: str
    prompt: str  # the user message
    answer: str  # reference: an integer (AIME) or a letter
    meta: dict = field(default_factory=dict)
    public: bool = True  # False: never write the prompt, the question or the response text anywhere

    @property
    def prompt_sha256(self) -> str:
        return prompts.sha256_text(self.prompt)


# --- staging --------------------------------------------------------------------------------------

def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _files(source: dict) -> dict:
    """{path: sha256 or None} from a list of paths or a mapping."""
    files = source.get("files") or {}
    return dict.fromkeys(files) if isinstance(files, (list, tuple)) else dict(files)


def stage(name: str, source: dict, local_dir=None, cache_dir=None, token=None, endpoint=None,
          client=None) -> dict:
    """Make the data set's files available locally; return {path_in_repo: {"path", "sha256"}}.

    ``source``: {"repo_id", "revision", "files": {path: sha256}}. With ``local_dir`` nothing is fetched;
    without it the files are downloaded into (and reused from) ``cache_dir``, which the caller names.
    """
    repo_id = source.get("repo_id") or DEFAULT_SOURCES[name]["repo_id"]
    files = _files(source) or dict.fromkeys(DEFAULT_SOURCES[name]["files"])
    staged = {}
    for rel, pinned in files.items():
        if local_dir:
            path = Path(local_dir) / repo_id / rel
            if not path.is_file():
                raise DatasetError("%s: %s not found (local data directory %s)" % (name, path, local_dir))
        else:
            revision = str(source.get("revision") or "")
            if not re.fullmatch(r"[0-9a-f]{40}", revision):
                raise DatasetError("%s: a Hub download needs a pinned 40-hex commit as revision, got %r"
                                   % (name, revision or None))
            if not pinned:
                raise DatasetError("%s: %s has no sha256 pin; refusing an unpinned download" % (name, rel))
            # The caller's cache (pdctl's, or the action plugin's default): this code imports no pdctl package.
            if not cache_dir:
                raise DatasetError("%s: a Hub download needs a cache directory (cache_dir)" % name)
            path = Path(cache_dir) / repo_id / revision / rel
            if not path.is_file() or sha256_file(path) != pinned:
                _download(endpoint or HUB_ENDPOINT, repo_id, revision, rel, path, token, client)
        digest = sha256_file(path)
        if pinned and digest != pinned:
            raise DatasetError("%s: %s has sha256 %s, expected %s" % (name, path, digest, pinned))
        staged[rel] = {"path": str(path), "sha256": digest}
    return staged


def hub_url(endpoint: str, repo_id: str, revision: str, rel: str) -> str:
    return "%s/datasets/%s/resolve/%s/%s" % (endpoint.rstrip("/"), repo_id, quote(revision, safe=""),
                                             quote(rel))


def _download(endpoint, repo_id, revision, rel, dest: Path, token, client=None):
    import httpx

    url = hub_url(endpoint, repo_id, revision, rel)
    headers = {"Authorization": "Bearer %s" % token} if token else {}
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    own = client is None
    client = client or httpx.Client(follow_redirects=True, timeout=httpx.Timeout(60.0, read=300.0))
    try:
        with client.stream("GET", url, headers=headers) as resp:
            if resp.status_code in (401, 403):
                raise DatasetError("%s: the Hub refused %s/%s (HTTP %d): gated data set, check the token and "
                                   "that its account accepted the data set's terms"
                                   % (repo_id, revision[:12], rel, resp.status_code))
            if resp.status_code != 200:
                raise DatasetError("%s: GET %s/%s failed with HTTP %d" % (repo_id, revision[:12], rel,
                                                                          resp.status_code))
            with open(tmp, "wb") as fh:
                for chunk in resp.iter_bytes(1 << 20):
                    fh.write(chunk)
    except httpx.HTTPError as exc:  # the message names the URL, never the headers
        raise DatasetError("%s: download of %s failed: %s" % (repo_id, rel, type(exc).__name__)) from exc
    finally:
        if own:
            client.close()
    tmp.replace(dest)


# --- reading --------------------------------------------------------------------------------------

def _records(path: Path) -> list[dict]:
    text = Path(path).read_text(encoding="utf-8")
    if path.suffix == ".csv":
        return list(csv.DictReader(io.StringIO(text)))
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    return data if isinstance(data, list) else data.get("data") or data.get("rows") or []


def load_aime(staged: dict) -> list[Item]:
    items = []
    for rel, info in staged.items():
        stem = Path(rel).stem
        for index, rec in enumerate(_records(Path(info["path"]))):
            problem = rec.get("question") or rec.get("problem") or rec.get("Problem")
            answer = rec.get("answer", rec.get("Answer"))
            if problem is None or answer is None:
                raise DatasetError("AIME %s record %d lacks question/problem or answer" % (rel, index))
            item_id = str(rec.get("id") or rec.get("ID") or "%s-%d" % (stem, index + 1))
            items.append(Item("aime", item_id, prompts.aime_prompt(problem), str(answer).strip()))
    return items


def load_gpqa(staged: dict, seed: int) -> list[Item]:
    items = []
    for rel, info in staged.items():
        for index, rec in enumerate(_records(Path(info["path"]))):
            try:
                question = rec["Question"]
                correct = rec["Correct Answer"]
                wrong = [rec["Incorrect Answer %d" % i] for i in (1, 2, 3)]
            except KeyError as exc:  # never print the record
                raise DatasetError("GPQA %s row %d lacks column %s" % (rel, index + 1, exc)) from None
            qhash = prompts.sha256_text(question)[:16]
            item_id = str(rec.get("Record ID") or "q" + qhash)
            choices, letter = prompts.gpqa_shuffle(item_id, correct, wrong, seed)
            items.append(Item("gpqa", item_id, prompts.gpqa_prompt(question, choices), letter,
                              meta={"question_sha256": qhash}, public=False))
    return items


def load_longbench(staged: dict, max_context_tokens: int = 0, buckets: dict | None = None, n=None,
                   seed: int = 0) -> list[Item]:
    """Sample first (by length bucket, or n overall), then build the (long) prompts of the chosen items."""
    records = {}
    for rel, info in staged.items():
        for rec in _records(Path(info["path"])):
            records[str(rec["_id"])] = rec
    light = [Item("longbench", rid, "", str(rec["answer"]).strip(),
                  meta={"length": rec.get("length"), "domain": rec.get("domain"),
                        "difficulty": rec.get("difficulty")})
             for rid, rec in records.items()]
    chosen = sample_by_length(light, buckets, seed) if buckets else sample(light, n, seed)
    for item in chosen:
        rec = records[item.id]
        choices = [rec["choice_%s" % L] for L in prompts.LETTERS]
        item.prompt = prompts.longbench_prompt(rec["context"], rec["question"], choices, max_context_tokens)
    return chosen


# --- sampling -------------------------------------------------------------------------------------

def sample(items: list[Item], n, seed: int) -> list[Item]:
    """A deterministic sample of n items (all when n is None or >= len), in a stable order."""
    ordered = sorted(items, key=lambda it: it.id)
    if n is None or n >= len(ordered):
        return ordered
    rng = random.Random("%d:%s" % (seed, ordered[0].benchmark if ordered else ""))
    return sorted(rng.sample(ordered, int(n)), key=lambda it: it.id)


def sample_by_length(items: list[Item], buckets: dict, seed: int) -> list[Item]:
    """LongBench v2: {"short": 20, "medium": 20, "long": 20} items per length bucket."""
    chosen = []
    for bucket, n in buckets.items():
        pool = [it for it in items if it.meta.get("length") == bucket]
        if len(pool) < int(n):
            raise DatasetError("LongBench v2 has %d %s items, %d requested" % (len(pool), bucket, n))
        chosen += sample(pool, n, seed)
    return chosen


def load_benchmark(name: str, source: dict, settings: dict, seed: int, local_dir=None, cache_dir=None,
                   token=None, endpoint=None) -> tuple[list[Item], dict]:
    """Stage, read and sample one benchmark; returns (items, provenance)."""
    staged = stage(name, source, local_dir=local_dir, cache_dir=cache_dir, token=token, endpoint=endpoint)
    if name == "aime":
        items = sample(load_aime(staged), settings.get("samples"), seed)
    elif name == "gpqa":
        items = sample(load_gpqa(staged, seed), settings.get("samples"), seed)
    elif name == "longbench":
        items = load_longbench(staged, int(settings.get("max_context_tokens") or 0), settings.get("buckets"),
                               settings.get("samples"), seed)
    else:
        raise DatasetError("unknown benchmark %r (known: %s)" % (name, ", ".join(BENCHMARKS)))
    provenance = {
        "repo_id": source.get("repo_id") or DEFAULT_SOURCES[name]["repo_id"],
        "revision": None if local_dir else source.get("revision"),
        "local_dir": str(local_dir) if local_dir else None,
        "files": {rel: info["sha256"] for rel, info in staged.items()},
        "seed": seed,
        "items": len(items),
    }
    return items, provenance
