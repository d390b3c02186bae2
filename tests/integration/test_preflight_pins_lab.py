"""Preflight on the lab (issue 38, acceptance 4): the all-zero model revision is refused with a clear
message before anything on a host changes."""
import pytest

from conftest import LAB_ENV
from inventories import inventory_variant
from pdctl import runner

pytestmark = [pytest.mark.lab]


def test_the_placeholder_model_revision_stops_in_preflight(lab, tmp_path):
    inv = inventory_variant(tmp_path / "inv", {"group_vars/all": {"pdctl_model_revision": "0" * 40}})
    result = runner.run_playbook("site.yml", inv, envvars=LAB_ENV)
    assert not result.ok
    assert result.total("changed") == 0
    assert {f["task"] for f in result.failures} == {"The model revision is pinned"}
    message = str(result.failures[0]["msg"])
    assert "the all-zero placeholder" in message and "Nothing was changed" in message, message
