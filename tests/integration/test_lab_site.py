"""site.yml on the lab hosts: converge, idempotence, truthful check mode, and preflight rejections."""
import pytest

from inventories import inventory_variant
from malformed import CASES
from pdctl import runner

pytestmark = [pytest.mark.lab, pytest.mark.slow]

from conftest import LAB_ENV  # noqa: E402


def test_converge_touches_every_host(converged_lab):
    assert set(converged_lab.stats["ok"]) == {"lab-prefill-0", "lab-prefill-1", "lab-decode-0"}
    assert converged_lab.total("failures") == 0 and converged_lab.total("dark") == 0


def test_second_run_changes_nothing(second_run):
    assert second_run.ok, second_run.failures
    assert second_run.total("changed") == 0, "not idempotent:\n" + second_run.recap()


def test_check_diff_on_converged_lab_reports_nothing(check_run):
    assert check_run.ok, check_run.failures
    assert check_run.total("changed") == 0, check_run.recap()


@pytest.mark.parametrize("case,overrides,expected", CASES, ids=[c[0] for c in CASES])
def test_malformed_inventory_stops_in_preflight(lab, tmp_path, case, overrides, expected):
    inv = inventory_variant(tmp_path / "inv", overrides)
    result = runner.run_playbook("site.yml", inv, envvars=LAB_ENV)
    assert not result.ok
    assert result.total("changed") == 0
    assert [f["task"] for f in result.failures] == ["Inventory describes a valid P/D deployment"]
    message = str(result.failures[0]["msg"])
    assert "nothing was changed" in message
    for words in expected:
        assert words in message


@pytest.mark.parametrize("overrides,task,words", [
    ({"group_vars/all": {"pdctl_model_size_gb": 100000}}, "Model filesystem has room for the model",
     ["GB free on /mnt/model", "needs 100000 GB + 10% margin = 110000.0 GB"]),
    ({"group_vars/all": {"pdctl_supported_os": [{"distribution": "Ubuntu", "version": "24.04"}]}},
     "Operating system is supported", ["runs Debian 12", "supported: Ubuntu 24.04"]),
    ({"group_vars/all": {"pdctl_min_memory_gb": 100000}}, "Host has enough CPUs and memory",
     ["needs >= 1 CPUs and >= 100000 GiB"]),
], ids=["disk", "os", "memory"])
def test_unfit_host_fails_before_any_change(lab, tmp_path, overrides, task, words):
    inv = inventory_variant(tmp_path / "inv", overrides)
    result = runner.run_playbook("site.yml", inv, envvars=LAB_ENV)
    assert not result.ok
    assert result.total("changed") == 0
    assert {f["task"] for f in result.failures} == {task}
    assert {f["host"] for f in result.failures} == {"lab-prefill-0", "lab-prefill-1", "lab-decode-0"}
    for f in result.failures:
        assert f["host"] in f["msg"]
        for w in words:
            assert w in f["msg"]
