"""The stand-in's faults drive pdctl's own code on the lab, not only the stand-in: a slow start is
waited out by the vllm role's readiness check. (The leak fault drives the soak gate:
tests/integration/test_soak_standin.py.)

Not here yet: a crash (crash_after_requests) restarted by systemd while the router serves around it.
Tried on the lab: the instance crashes as configured, but systemd inside the lab's containers (cgroup v1,
no release agent) keeps the unit "deactivating" for 75-165 s after its main process exited, until it
notices the engine-core processes gone, so Restart=on-failure fires minutes late. That is the lab's
container, not the unit; the test needs a lab host where systemd sees its cgroups empty."""
import time

import httpx
import pytest
import yaml

from conftest import LAB_ENV
from inventories import ROOT, inventory_variant
from pdctl import runner
from test_serving import INSTANCES, on_host

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
