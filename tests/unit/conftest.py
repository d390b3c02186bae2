"""Fixtures shared by the unit tests."""
import pytest

from inventories import ROOT
from pdctl import cli


@pytest.fixture(scope="session")
def rendered(tmp_path_factory):
    """`pdctl render` of the b300 and lab inventories, once per session: {inventory: output dir}."""
    out = {}
    for inv in ("b300", "lab"):
        d = tmp_path_factory.mktemp("render-" + inv)
        assert cli.main(["render", "-i", str(ROOT / "inventories" / inv), "--out", str(d)]) == 0
        out[inv] = d
    return out
