"""Report files: JSON, Markdown and PNG (plugin_utils.gates.report)."""
from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import accuracy, report, sla

PNG = b"\x89PNG\r\n\x1a\n"
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gates" / "vllm_rs_bench_result.json"


def _rows(name, n, correct, private=False):
    rows = []
    for i in range(n):
        row = {"benchmark": name, "id": "%s%d" % (name, i), "repeat": 0, "expected": "A", "status": "ok",
               "extracted": "A" if i < correct else "B", "parsed": True, "truncated": False, "correct": i < correct}
        if private:
            row["question_sha256"] = "%016x" % i
        rows.append(row)
    return rows


def test_accuracy_report_files(tmp_path):
    cfg = accuracy.merge_config({})
    rows = _rows("gpqa", 64, 40, private=True)
    summary = accuracy.summarize("gpqa", rows, cfg["gpqa"], cfg, {"correct": 58, "samples": 64})
    assert not summary["passed"]
    assert any("40/64 correct" in c["message"] and "below the floor 52" in c["message"] for c in summary["checks"])
    result = {"router_url": "http://r:8000", "model": "m", "wall_s": 1.0, "benchmarks": {"gpqa": summary},
              "passed": False, "failures": [c["message"] for c in summary["checks"] if not c["ok"]],
              "datasets": {"gpqa": {"repo_id": "Idavidrein/gpqa", "revision": "0" * 40, "files": {"f.csv": "ab" * 32},
                                    "seed": 1, "items": 64}}}
    files = report.write_accuracy(tmp_path, result, rows)
    data = json.loads(Path(files["json"]).read_text())
    assert data["passed"] is False and data["benchmarks"]["gpqa"]["floor"] == 52
    md = Path(files["markdown"]).read_text()
    assert "FAILED" in md and "| gpqa | 40/64 |" in md
    assert Path(files["plot"]).read_bytes()[:8] == PNG
    assert len(Path(files["items"]).read_text().splitlines()) == 64


def test_sla_report_files(tmp_path):
    run = sla.parse_result(json.loads(FIXTURE.read_text()))
    cfg = sla.merge_config({})
    runs = []
    for ctx, tpot in ((16384, 17.0), (65536, 24.5)):
        r = dict(run, input_len=ctx, concurrency=8, num_prompts=8, mean_tpot_ms=tpot)
        r["problems"] = sla.judge(r, cfg)
        r["passed"] = not r["problems"]
        runs.append(r)
    probes = [dict(runs[0], concurrency=c, passed=c <= 4, mean_tpot_ms=10 + c) for c in (1, 2, 4, 8, 6)]
    result = {"router_url": "http://r:8000", "limits": {"max_ttft_ms": 2500.0, "max_tpot_ms": 20.0},
              "concurrency": 8, "output_len": 1024, "runs": runs, "wall_s": 3.0,
              "failures": [m for r in runs for m in r["problems"]], "passed": False,
              "capacity": {"per_context": {16384: 4}, "max_concurrency": 4, "bounded_by_max": False,
                           "router_max_concurrent_requests": 4, "probes": probes}}
    files = report.write_sla(tmp_path, result)
    assert json.loads(Path(files["json"]).read_text())["capacity"]["max_concurrency"] == 4
    md = Path(files["markdown"]).read_text()
    assert "context 65536: mean TPOT 24.50 ms > limit 20.00 ms" in md and "--max-concurrent-requests 4" in md
    for key in ("plot_context", "plot_concurrency"):
        assert Path(files[key]).read_bytes()[:8] == PNG


def test_default_dir_is_timestamped():
    d = report.default_dir()
    assert d.parent == Path("artifacts/gates") and d.name.endswith("Z")
