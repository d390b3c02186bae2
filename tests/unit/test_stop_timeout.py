"""Preflight: the units' TimeoutStopSec (pdctl_serve_stop_timeout_s) outlasts every pool's --shutdown-timeout
(issue 37): systemd sends SIGKILL at TimeoutStopSec, which would cut the drain short."""
from __future__ import annotations

import pytest
import yaml

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import serving
from inventories import ROOT, group_var
from test_role_tasks import run_role_tasks

SERVING = {name: group_var("b300", name) for name in ("pdctl_serve_args", "pdctl_serve_stop_timeout_s")}


@pytest.mark.parametrize("args,seconds", [
    (["--shutdown-timeout", "300"], 300),
    (["--shutdown-timeout=240"], 240),
    (["--shutdown-timeout", "300", "--shutdown-timeout=30"], 30),   # the last one wins, as with argparse
    (["--trust-remote-code"], 0),                                     # vLLM's default: abort at once
])
def test_shutdown_timeout_of_a_pools_args(args, seconds):
    assert serving.shutdown_timeout(args) == seconds


def test_the_production_inventory_outlasts_its_drains():
    for inv in ("b300", "lab"):
        assert serving.stop_timeout_problems(group_var(inv, "pdctl_serve_args"),
                                             group_var(inv, "pdctl_serve_stop_timeout_s")) == [], inv


def test_a_stop_timeout_at_or_below_a_drain_names_the_pool():
    args = {"prefill": ["--shutdown-timeout", "240"], "decode": ["--shutdown-timeout=300"]}
    assert serving.stop_timeout_problems(args, 301) == []
    assert serving.stop_timeout_problems(args, 300) == [
        "pdctl_serve_stop_timeout_s (the units' TimeoutStopSec) is 300 s, not longer than the decode pool's "
        "--shutdown-timeout 300 s: systemd would kill an instance before its drain ends; set it above 300"]
    assert len(serving.stop_timeout_problems(args, 200)) == 2
    assert "whole number" in serving.stop_timeout_problems({"decode": ["--shutdown-timeout", "5m"]}, 330)[0]
    assert "whole number" in serving.stop_timeout_problems(args, "soon")[0]


def test_preflight_passes_the_inventory_and_refuses_a_short_stop_timeout(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ok, out = run_role_tasks(tmp_path / "a", "preflight", "0025-stop-timeout.yml", {
        "pdctl_serve_args": SERVING["pdctl_serve_args"],
        "pdctl_serve_stop_timeout_s": SERVING["pdctl_serve_stop_timeout_s"]})
    assert ok, out
    ok, out = run_role_tasks(tmp_path / "b", "preflight", "0025-stop-timeout.yml", {
        "pdctl_serve_args": SERVING["pdctl_serve_args"], "pdctl_serve_stop_timeout_s": 300})
    assert not ok
    assert "The units stop before the drain ends; nothing was changed" in out
    assert "is 300 s, not longer than the decode pool's --shutdown-timeout 300 s" in out
