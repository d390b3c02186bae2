"""The stand-in's faults drive pdctl's own code on the lab, not only the stand-in: a crashing instance
is restarted by its systemd unit while the router keeps serving through the others, and a slow start
is waited out by the vllm role's readiness check. (The leak fault drives the soak gate:
tests/integration/test_soak_standin.py.)"""
import time

import httpx
import pytest
import yaml

from conftest import LAB_ENV
from inventories import ROOT, inventory_variant
from pdctl import runner
from test_serving import INSTANCES, MODEL, ROUTER, api_key, on_host

pytestmark = [pytest.mark.lab, pytest.mark.slow]

FAULTY = "lab-prefill-1"  # prefill-2 and prefill-3; prefill-0/1 on lab-prefill-0 stay healthy


def faulty_inventory(tmp_path, name, faults):
    """The lab inventory with FAULTY's instances on an engine profile with these faults (the
    inventory's pdctl_engine, as an operator would change it: a profile file and its variable)."""
    profile = yaml.safe_load((ROOT / ".lab/engine/profile.yml").read_text())
    profile["faults"] = dict(profile.get("faults") or {}, **faults)
    src = ROOT / ".lab" / "engine" / ("profile-%s.yml" % name)
    src.write_text(yaml.safe_dump(profile))
    dest = "/etc/pdctl/engine/profile-%s.yml" % name
    engine = yaml.safe_load((ROOT / "inventories/lab/group_vars/all/engine.yml").read_text())["pdctl_engine"]
    engine = dict(engine, files=engine["files"] + [{"src": str(src), "dest": dest}],
                  environment=dict(engine["environment"], PDCTL_ENGINE_PROFILE=dest))
    return inventory_variant(tmp_path / "inv", {"host_vars/" + FAULTY: {"pdctl_engine": engine}})


def apply_vllm(inventory):
    t0 = time.monotonic()
    result = runner.run_playbook("site.yml", inventory, tags="vllm", limit=FAULTY, envvars=LAB_ENV)
    return result, time.monotonic() - t0


@pytest.fixture
def restore_engine(lab):
    """After the test, FAULTY's instances back on the lab's own profile (as the role puts them)."""
    yield
    result, _ = apply_vllm(lab)
    assert result.ok, result.failures


def unit_show(name, prop):
    return on_host(FAULTY, "systemctl", "show", "-p", prop, "--value", "pdctl-vllm-%s.service" % name).strip()


def ask(client, n):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Request %d about GPUs." % n}],
            "max_tokens": 4}
    return client.post(ROUTER + "/v1/chat/completions", json=body, timeout=60)


def test_slow_start_is_waited_out_by_the_readiness_check(converged_lab, restore_engine, tmp_path):
    slow_s = 20
    result, took = apply_vllm(faulty_inventory(tmp_path, "slow", {"slow_start_s": slow_s}))
    assert result.ok, result.failures
    assert result.total("changed") > 0, "the new profile did not reach the instances"
    # The play ended only once the instances answered: it took the slow start, and they are ready now.
    assert took >= slow_s, "the play ended %.0fs after it started, before a %ds start was over" % (took, slow_s)
    for name in INSTANCES[FAULTY]:
        port = on_host(FAULTY, "sh", "-c", "grep -o -- '--port [0-9]*' /etc/systemd/system/pdctl-vllm-%s.service"
                       % name).split()[-1]
        assert httpx.get("http://10.89.64.12:%s/health" % port, timeout=5).status_code == 200, name


def test_a_crashing_instance_is_restarted_and_the_router_serves_around_it(converged_lab, restore_engine, tmp_path):
    result, _ = apply_vllm(faulty_inventory(tmp_path, "crash", {"crash_after_requests": 2}))
    assert result.ok, result.failures
    restarts = {name: int(unit_show(name, "NRestarts")) for name in INSTANCES[FAULTY]}
    answered = []
    with httpx.Client(headers={"Authorization": "Bearer " + api_key()}) as client:
        for n in range(24):
            answered.append(ask(client, n).status_code)
    # Round robin sends a quarter of the requests to each faulty instance: both crash at least once.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = {name: int(unit_show(name, "NRestarts")) for name in INSTANCES[FAULTY]}
        active = {name: unit_show(name, "ActiveState") for name in INSTANCES[FAULTY]}
        if all(now[n] > restarts[n] for n in now) and set(active.values()) == {"active"}:
            break
        time.sleep(2)
    assert all(now[n] > restarts[n] for n in now), "systemd did not restart the crashed instances: %s" % now
    assert set(active.values()) == {"active"}, active
    # The router keeps answering: the healthy prefill instances serve while the faulty ones are down.
    assert answered.count(200) >= len(answered) - 2, answered
