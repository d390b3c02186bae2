"""library/accuracy_gate.py and library/sla_gate.py: documentation, check mode, input errors."""
from __future__ import annotations


from module_harness import run

from pdctl import collection

ROOT = collection.root()
DATA = ROOT / "tests" / "fixtures" / "gates" / "datasets"
MODULES = ("accuracy_gate", "sla_gate")








def test_accuracy_check_mode_validates_and_runs_nothing(capsys, tmp_path):
    args = {"router_url": "http://127.0.0.1:9", "local_dir": str(DATA), "artifacts_dir": str(tmp_path / "a"),
            "hf_token": "hf_secretTOKEN123"}
    failed, result, out = run("accuracy_gate", args, capsys, check_mode=True)
    assert not failed and result["validated"] and not (tmp_path / "a").exists()
    assert "hf_secretTOKEN123" not in out


def test_accuracy_rejects_unpinned_hub_source(capsys, tmp_path):
    args = {"router_url": "http://127.0.0.1:9", "artifacts_dir": str(tmp_path), "benchmarks": ["gpqa"],
            "datasets": {"gpqa": {"repo_id": "Idavidrein/gpqa", "revision": "main"}}}
    failed, result, _ = run("accuracy_gate", args, capsys, check_mode=True)
    assert failed and "gpqa: no local_dir and no pinned 40-hex revision" in result["msg"]


def test_accuracy_unreachable_router_fails_cleanly(capsys, tmp_path):
    args = {"router_url": "http://127.0.0.1:9", "local_dir": str(DATA), "artifacts_dir": str(tmp_path),
            "benchmarks": ["aime"]}
    failed, result, _ = run("accuracy_gate", args, capsys)
    assert failed and "127.0.0.1:9" in result["msg"]


def test_sla_check_mode_and_bad_input(capsys, tmp_path):
    args = {"router_url": "http://127.0.0.1:9", "client": ["/bin/true"], "artifacts_dir": str(tmp_path / "s")}
    failed, result, _ = run("sla_gate", args, capsys, check_mode=True)
    assert not failed and result["validated"] and not (tmp_path / "s").exists()
    failed, result, _ = run("sla_gate", dict(args, contexts=[], client=["/nonexistent/vllm"]), capsys, check_mode=True)
    assert failed and "contexts must be" in result["msg"] and "not found" in result["msg"]


def test_sla_client_failure_names_context(capsys, tmp_path):
    args = {"router_url": "http://127.0.0.1:9", "client": ["/bin/false"], "contexts": [2048],
            "artifacts_dir": str(tmp_path)}
    failed, result, _ = run("sla_gate", args, capsys)
    assert failed and "context 2048: the benchmark client exited 1" in result["msg"]


def test_config_applies_where_an_option_is_left_unset(capsys, tmp_path):
    """An inventory dict passed as `config` is honoured; only options actually given override it."""
    base = {"router_url": "http://127.0.0.1:9", "artifacts_dir": str(tmp_path / "a")}
    failed, res, _ = run("sla_gate", dict(base, config={"contexts": [0]}), capsys, check_mode=True)
    assert failed and "context" in res["msg"], res
    failed, res, _ = run("sla_gate", dict(base, config={"contexts": [0]}, contexts=[1024],
                                          client=["/bin/true"]), capsys, check_mode=True)
    assert not failed and res["validated"], res
