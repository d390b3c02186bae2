"""The routers' total deadline (issue 40): vllm-router's --request-timeout-secs cuts a stream still running
at it, so the role derives it from the longest legitimate stream (pdctl_router.longest_stream) and refuses
a shorter one before anything changes; the rendered production units carry the derived value."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from ansible_collections.pdctl.vllm_pd.plugins.filter import deadline

from inventories import ROOT, group_var


PRODUCTION = group_var("b300", "pdctl_router")


def test_longest_stream_is_prefill_plus_every_token_at_the_tpot_with_margin():
    assert deadline.longest_stream_s({"max_output_tokens": 1000, "tpot_ms": 20, "prefill_s": 10, "margin": 2}) == 60
    # Production: a 1M-token answer at the SLA's 20 ms, after a 600 s prefill, twice over: about 12 h,
    # where the old fixed 1800 s cut any answer over ~90K tokens.
    assert deadline.longest_stream_s(PRODUCTION["longest_stream"]) == 43144
    assert "request_timeout_secs" not in PRODUCTION


# The fixed --request-timeout-secs the inventories carried before the deadline was derived.
OLD_FIXED_S = 1800


def test_the_old_fixed_deadline_cut_answers_that_the_derived_one_lets_finish():
    spec = PRODUCTION["longest_stream"]
    tpot_s = spec["tpot_ms"] / 1000
    # At the SLA's TPOT the old deadline held 90K tokens, with no prefill at all; a 100K-token answer (2000 s)
    # was cut, as was the longest legitimate one (a 1M-token answer after the longest prefill, ~6 h).
    assert OLD_FIXED_S / tpot_s == 90000
    for stream_s in (100000 * tpot_s, spec["prefill_s"] + spec["max_output_tokens"] * tpot_s):
        assert OLD_FIXED_S < stream_s <= deadline.longest_stream_s(spec), stream_s


@pytest.mark.parametrize("scale", [1, 16, 256])
def test_scaling_the_durations_down_scales_the_deadline_down(scale):
    """tests/integration/test_long_requests_lab.py runs the lab's routers with the longest answer and the
    longest prefill divided by 256 (TPOT and margin kept): the deadline shrinks by the same factor (up to the
    rounding up), 169 s, and the old fixed deadline scaled alike, 7.0 s, is shorter than its 1024-token answer
    at the SLA's TPOT (20.5 s; the stand-in streams it in ~10 s, still over 7.0 s)."""
    spec = PRODUCTION["longest_stream"]
    small = dict(spec, max_output_tokens=spec["max_output_tokens"] // scale, prefill_s=spec["prefill_s"] / scale)
    assert deadline.longest_stream_s(small) == pytest.approx(deadline.longest_stream_s(spec) / scale, abs=1)
    if scale == 256:
        assert deadline.longest_stream_s(small) == 169
        assert OLD_FIXED_S / scale < 1024 * spec["tpot_ms"] / 1000 < deadline.longest_stream_s(small)


@pytest.mark.parametrize("spec", [{"max_output_tokens": 1000, "tpot_ms": 20, "prefill_s": 10},
                                  {"max_output_tokens": 1000, "tpot_ms": 20, "prefill_s": 10, "margin": 0.5},
                                  {"max_output_tokens": "many", "tpot_ms": 20, "prefill_s": 10, "margin": 2}])
def test_bad_longest_stream_is_a_clear_error(spec):
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError, match="pdctl_router.longest_stream"):
        deadline.longest_stream_s(spec)


def _validate(tmp_path, settings):
    playbook = tmp_path / "validate.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "vars_files": [str(ROOT / "roles/router/vars/main.yml")],
        "tasks": [{"ansible.builtin.include_tasks": str(ROOT / "roles/router/tasks/0005-validate.yml")}]}]))
    (tmp_path / "extra.yml").write_text(yaml.safe_dump({"router_settings": settings,
                                                        "ansible_python_interpreter": sys.executable}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    return subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                           "-c", "local", str(playbook), "-e", "@%s" % (tmp_path / "extra.yml")],
                          capture_output=True, text=True, env=env, cwd=tmp_path)


def test_a_deadline_shorter_than_the_longest_stream_is_refused(tmp_path):
    res = _validate(tmp_path, dict(PRODUCTION, request_timeout_secs=1800))
    assert res.returncode != 0
    assert "shorter than the longest legitimate" in res.stdout and "43144" in res.stdout, res.stdout[-2000:]


def test_the_derived_deadline_and_a_longer_one_pass(tmp_path):
    for settings in (PRODUCTION, dict(PRODUCTION, request_timeout_secs=50000)):
        res = _validate(tmp_path, settings)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]


def test_rendered_units_carry_the_derived_deadline(tmp_path):
    from pdctl import cli

    assert cli.main(["render", "-i", str(ROOT / "inventories/b300"), "--out", str(tmp_path)]) == 0
    for unit in ("pdctl-router.service", "pdctl-router-aggregated.service"):
        text = (tmp_path / "b300-decode-0/etc/systemd/system" / unit).read_text()
        assert "--request-timeout-secs 43144 " in text, unit
