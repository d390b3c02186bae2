"""roles/traffic (the rolling playbooks' traffic moves) offline on the controller: its entry points, the
refusals of a move that does not say what it needs, and an instance's drain where it serves nothing."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from inventories import ROOT

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
ROLE = ROOT / "roles/traffic"


def _run(tmp_path, tasks_from, extravars, after=()):
    play = [{"name": "traffic", "hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars": {"ansible_python_interpreter": sys.executable},
             "tasks": [{"name": "move under test", "ansible.builtin.include_role":
                        {"name": "pdctl.vllm_pd.traffic", **({"tasks_from": tasks_from} if tasks_from else {})}}]
             + list(after)}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "vars.json").write_text(json.dumps(extravars))
    res = subprocess.run([ANSIBLE_PLAYBOOK, str(tmp_path / "play.yml"), "-i", "localhost,", "-e", "@%s" % (tmp_path / "vars.json")],
                         cwd=ROOT, capture_output=True, text=True,
                         env={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": "/usr/bin:/bin",
                              "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "HOME": str(tmp_path)})
    return res.returncode == 0, res.stdout + res.stderr


def test_every_entry_point_has_its_tasks_file_and_every_tasks_file_an_entry_point():
    specs = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]
    files = {p.stem for p in (ROLE / "tasks").glob("*.yml")}
    assert set(specs) == files
    moves = specs["main"]["options"]["traffic_move"]["choices"]
    assert set(moves) == files - {"main"}
    # Every option the role reads has the role's prefix.
    assert all(o.startswith("traffic_") for spec in specs.values() for o in spec.get("options", {}))


def test_the_role_without_an_entry_point_names_them(tmp_path):
    ok, out = _run(tmp_path, None, {})
    assert not ok and "traffic_move" in out


def test_main_dispatches_to_the_named_move(tmp_path):
    ok, out = _run(tmp_path, None, {"traffic_move": "nowhere"})
    assert not ok and "value of traffic_move must be one of" in out


def test_a_move_away_says_what_its_target_serves(tmp_path):
    ok, out = _run(tmp_path, "frontdoor_away", {"preflight_plan": {"frontdoor": {"hosts": []}, "routers": []}})
    assert not ok and "missing required arguments: traffic_capacity" in out


def test_a_move_home_with_a_temporary_decode_says_what_the_routers_serve(tmp_path):
    ok, out = _run(tmp_path, "frontdoor_home", {"preflight_plan": {"frontdoor": {"hosts": []}, "routers": []},
                                                    "traffic_check_decode": "http://10.0.0.9:8200"})
    assert not ok and "traffic_check_decode is given without traffic_capacity" in out


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_instance_that_serves_nothing_has_nothing_to_drain_and_no_previous_answer(tmp_path):
    instance = {"name": "prefill-0", "host": "localhost", "api_port": _closed_port(), "model_path": "/m"}
    show = {"name": "answer", "ansible.builtin.debug": {"msg": "answer=[{{ traffic_previous_answer }}]"}}
    ok, out = _run(tmp_path, "drain_instance", {"traffic_instance": instance, "traffic_canary_request": {"prompt": "x"},
                                                     "traffic_api_key": "k"}, after=[show])
    assert ok, out
    assert "Instance has finished what it had" not in out and "skipped=2" in out   # no canary, no drain
    assert "answer=[]" in out


def test_a_temporary_decode_names_its_lender_both_ways(tmp_path):
    for entry in ("temporary_decode_in", "temporary_decode_out"):
        ok, out = _run(tmp_path, entry, {"preflight_plan": {"frontdoor": {"hosts": []}, "routers": [], "instances": []}})
        assert not ok and "missing required arguments: traffic_lender" in out, (entry, out)


def test_the_standby_taking_the_front_door_says_what_it_serves(tmp_path):
    ok, out = _run(tmp_path, "standby_in", {"preflight_plan": {"frontdoor": {"hosts": []}, "routers": []}})
    assert not ok and "missing required arguments: traffic_capacity" in out


def test_a_host_leaving_the_front_doors_has_nothing_to_drain_where_no_other_front_door_is(tmp_path):
    ok, out = _run(tmp_path, "host_out", {"preflight_plan": {"frontdoor": {"hosts": ["h0"]}, "routers": []},
                                          "traffic_host": "h0"})
    assert ok and "changed=0" in out and "failed=0" in out, out
    ok, out = _run(tmp_path, "host_out", {"preflight_plan": {"frontdoor": {"hosts": ["h0"]}, "routers": []}})
    assert not ok and "missing required arguments: traffic_host" in out
