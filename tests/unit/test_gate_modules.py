"""The action plugins pdctl.vllm_pd.accuracy_gate and sla_gate, through a real ansible-playbook on localhost: check
mode, input errors, a gate that passes and one that fails its verdict.

All cases are tasks of one playbook (one ansible-playbook run for the module); each case's registered result is
read back by name."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from pdctl import cache, collection

ROOT = collection.root()
DATA = ROOT / "tests" / "fixtures" / "gates" / "datasets"
MODULES = ("accuracy_gate", "sla_gate")
ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
TOKEN = "hf_secretTOKEN123"
KEY = "sk-routerKEY456"

# A benchmark client that saves the result `vllm bench serve` would, with the mean TPOT it is given first.
FAKE_CLIENT = """import json, sys
tpot, argv = float(sys.argv[1]), sys.argv[2:]
arg = lambda name: argv[argv.index(name) + 1]
n = int(arg("--num-prompts"))
with open(arg("--result-dir") + "/" + arg("--result-filename"), "w") as fh:
    json.dump({"completed": n, "failed": 0, "num_prompts": n, "mean_ttft_ms": 100.0, "mean_tpot_ms": tpot,
               "total_output_tokens": n * int(arg("--random-output-len"))}, fh)
"""


def cases(tmp):
    """{case: (module, args, check mode)}."""
    client = [sys.executable, str(tmp / "client.py")]
    fast = {"output_len": 8, "concurrency": 1, "num_prompts": 2}
    base = {"router_url": "http://127.0.0.1:9", "artifacts_dir": str(tmp / "a")}
    return {
        "acc_check": ("accuracy_gate", {"router_url": "http://127.0.0.1:9", "local_dir": str(DATA),
                                        "artifacts_dir": str(tmp / "acc_check"), "hf_token": TOKEN, "api_key": KEY},
                      True),
        "acc_unpinned": ("accuracy_gate", {"router_url": "http://127.0.0.1:9", "artifacts_dir": str(tmp),
                                           "benchmarks": ["gpqa"],
                                           "datasets": {"gpqa": {"repo_id": "Idavidrein/gpqa", "revision": "main"}}},
                         True),
        "acc_unreachable": ("accuracy_gate", {"router_url": "http://127.0.0.1:9", "local_dir": str(DATA),
                                              "artifacts_dir": str(tmp), "benchmarks": ["aime"], "hf_token": TOKEN,
                                              "api_key": KEY}, False),
        "acc_bad_choice": ("accuracy_gate", dict(base, benchmarks=["mmlu"]), True),
        "sla_check": ("sla_gate", {"router_url": "http://127.0.0.1:9", "client": ["/bin/true"],
                                   "artifacts_dir": str(tmp / "s")}, True),
        "sla_bad_input": ("sla_gate", {"router_url": "http://127.0.0.1:9", "client": ["/nonexistent/vllm"],
                                       "artifacts_dir": str(tmp / "s"), "contexts": []}, True),
        "sla_client_fails": ("sla_gate", {"router_url": "http://127.0.0.1:9", "client": ["/bin/false"],
                                          "contexts": [2048], "artifacts_dir": str(tmp)}, False),
        "sla_config_only": ("sla_gate", dict(base, config={"contexts": [0]}), True),
        "sla_option_over_config": ("sla_gate", dict(base, config={"contexts": [0]}, contexts=[1024],
                                                    client=["/bin/true"]), True),
        "sla_missing_url": ("sla_gate", {"artifacts_dir": str(tmp)}, True),
        "sla_bad_type": ("sla_gate", dict(base, contexts=["a lot"]), True),
        "sla_unknown_option": ("sla_gate", dict(base, context=[1024]), True),
        "sla_passes": ("sla_gate", dict(fast, router_url="http://127.0.0.1:9", client=client + ["10"], api_key=KEY,
                                        contexts=[1024, 2048], max_tpot_ms=20, artifacts_dir=str(tmp / "pass")),
                       False),
        "sla_fails": ("sla_gate", dict(fast, router_url="http://127.0.0.1:9", client=client + ["30"],
                                       contexts=[1024], max_tpot_ms=20, artifacts_dir=str(tmp / "fail")), False),
    }


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    """({case: the task's registered result}, the run's output with -v) of one real run of every case."""
    tmp = tmp_path_factory.mktemp("gates")
    (tmp / "client.py").write_text(FAKE_CLIENT)
    tasks = [{"name": name, "pdctl.vllm_pd." + module: args, "check_mode": check, "register": name,
              "ignore_errors": True} for name, (module, args, check) in cases(tmp).items()]
    tasks.append({"name": "Keep the results", "ansible.builtin.copy": {
        "content": "{{ {%s} | to_json }}" % ", ".join("'%s': %s" % (n, n) for n in cases(tmp)),
        "dest": str(tmp / "results.json"), "mode": "0644"}, "check_mode": False})
    book = tmp / "gates.yml"
    book.write_text(yaml.safe_dump([{"name": "Gates", "hosts": "localhost", "gather_facts": False,
                                     "vars": {"ansible_connection": "local"}, "tasks": tasks}], sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STRATEGY="linear",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    res = subprocess.run([ANSIBLE_PLAYBOOK, "-v", "-i", "localhost,", str(book)], cwd=ROOT, capture_output=True,
                         text=True, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    return json.loads((tmp / "results.json").read_text()), out, tmp


def run(played, name):
    """(failed, result) of one case."""
    results, _, _ = played
    return bool(results[name].get("failed")), results[name]


def test_accuracy_check_mode_validates_and_runs_nothing(played):
    failed, result = run(played, "acc_check")
    assert not failed and result["validated"] and not (played[2] / "acc_check").exists()
    assert TOKEN not in played[1] and KEY not in played[1]


def test_accuracy_rejects_unpinned_hub_source(played):
    failed, result = run(played, "acc_unpinned")
    assert failed and "gpqa: no local_dir and no pinned 40-hex revision" in result["msg"]


def test_accuracy_unreachable_router_fails_cleanly(played):
    failed, result = run(played, "acc_unreachable")
    assert failed and "127.0.0.1:9" in result["msg"]
    assert result["passed"] is False and TOKEN not in json.dumps(result) and KEY not in json.dumps(result)


def test_sla_check_mode_and_bad_input(played):
    failed, result = run(played, "sla_check")
    assert not failed and result["validated"] and not (played[2] / "s").exists()
    failed, result = run(played, "sla_bad_input")
    assert failed and "contexts must be" in result["msg"] and "not found" in result["msg"]


def test_sla_client_failure_names_context(played):
    failed, result = run(played, "sla_client_fails")
    assert failed and "context 2048: the benchmark client exited 1" in result["msg"]


def test_config_applies_where_an_option_is_left_unset(played):
    """An inventory dict passed as `config` is honoured; only options actually given override it."""
    failed, res = run(played, "sla_config_only")
    assert failed and "context" in res["msg"], res
    failed, res = run(played, "sla_option_over_config")
    assert not failed and res["validated"], res


@pytest.mark.parametrize("name,message", [
    ("sla_missing_url", "missing required arguments: router_url"),
    ("sla_bad_type", "contexts"),
    ("sla_unknown_option", "sla_gate) module: context. Supported parameters include"),
    ("acc_bad_choice", "benchmarks"),
])
def test_bad_arguments_fail_the_task_naming_the_option(played, name, message):
    """The action plugins validate their arguments with the spec their module file documents, check mode or not."""
    failed, result = run(played, name)
    assert failed and message in result["msg"], result
    assert "validated" not in result and "passed" not in result


def test_a_gate_that_meets_the_sla_passes_and_reports(played):
    failed, result = run(played, "sla_passes")
    assert not failed and result["passed"] and result["failures"] == [] and not result["changed"]
    assert [r["input_len"] for r in result["runs"]] == [1024, 2048]
    assert all(r["passed"] and r["mean_tpot_ms"] == 10.0 for r in result["runs"])
    assert json.loads((played[2] / "pass" / "sla.json").read_text())["passed"] is True
    assert result["files"]["markdown"].endswith("sla.md")
    assert KEY not in json.dumps(result)


def test_a_gate_over_the_limit_fails_its_verdict_naming_context_and_value(played):
    failed, result = run(played, "sla_fails")
    assert failed and result["passed"] is False
    assert result["msg"].startswith("SLA gate failed: context 1024: mean TPOT 30.00 ms > limit 20.00 ms")
    assert result["runs"][0]["mean_tpot_ms"] == 30.0 and result["files"]["markdown"] in result["msg"]


def test_the_default_hub_cache_is_pdctls(monkeypatch, tmp_path):
    """The action plugin does not import pdctl: its default cache directory follows pdctl.cache's rule."""
    from ansible_collections.pdctl.vllm_pd.plugins.action import accuracy_gate

    for env in ({"PDCTL_CACHE_DIR": str(tmp_path / "c")}, {"XDG_CACHE_HOME": str(tmp_path / "x")}, {}):
        for name in ("PDCTL_CACHE_DIR", "XDG_CACHE_HOME"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert accuracy_gate.default_cache_dir() == str(cache.cache_dir("datasets"))
