"""Exact binomial arithmetic (plugin_utils.gates.stats)."""
from __future__ import annotations

import math

import pytest

from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import accuracy, stats


def test_cdf_sums_to_one_and_matches_pmf():
    assert stats.cdf(10, 10, 0.3) == 1.0
    assert math.isclose(stats.cdf(3, 10, 0.3), sum(stats.pmf(k, 10, 0.3) for k in range(4)))
    assert math.isclose(stats.pmf(2, 4, 0.5), 6 / 16)


@pytest.mark.parametrize("n, p, floor", [(64, 0.929, 52), (120, 0.8667, 92), (60, 0.6401, 27)])
def test_floors_from_facts(n, p, floor):
    """facts.md: GPQA n=64 floor 52, AIME 30x4 floor 92/120, LongBench 60 floor 27, at a 0.1% false alarm."""
    assert stats.floor_for(n, p, 0.001) == floor
    assert stats.false_alarm(n, p, floor) <= 0.001 < stats.false_alarm(n, p, floor + 1)


def test_default_config_reproduces_the_floors():
    cfg = accuracy.merge_config({})
    assert stats.floor_for(64, cfg["gpqa"]["expected_accuracy"], cfg["alpha"]) == 52
    assert stats.floor_for(30 * cfg["aime"]["repeats"], cfg["aime"]["expected_accuracy"], cfg["alpha"]) == 92
    assert stats.floor_for(60, cfg["longbench"]["expected_accuracy"], cfg["alpha"]) == 27


def test_floor_edges():
    assert stats.floor_for(10, 1.0, 0.01) == 10
    assert stats.floor_for(10, 0.0, 0.01) == 0
    with pytest.raises(ValueError):
        stats.floor_for(10, 0.5, 0.0)


def test_clopper_pearson():
    lo, hi = stats.clopper_pearson(52, 64)
    assert 0.69 < lo < 0.70 and 0.89 < hi < 0.90
    assert stats.clopper_pearson(0, 10)[0] == 0.0 and stats.clopper_pearson(10, 10)[1] == 1.0


def test_reference_drop_test():
    # the same result as the reference is no drop at all
    assert stats.drop_p_value(58, 64, 58, 64) > 0.5
    # a collapse is caught
    assert stats.drop_p_value(20, 64, 58, 64) < 1e-6
    need = stats.min_passing(64, 58, 64, 0.01)
    assert stats.drop_p_value(need, 64, 58, 64) >= 0.01 > stats.drop_p_value(need - 1, 64, 58, 64)
    # hypergeometric cdf is a distribution
    assert math.isclose(stats.hypergeom_cdf(10, 20, 10, 10), 1.0)
