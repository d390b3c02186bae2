"""Issue 13 item 2: KV NICs and CPUs follow the GPUs (hardware profile -> plan -> units), the
emulated B300 shows a real HGX B300's NIC layout, and nvlink_check holds a host to that layout."""
import copy

import pytest

from test_hw_support import emulate, fake, profile  # noqa: F401  (sets up ansible.module_utils)

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import hwcheck, hwprofile, nvsmi as nv

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import topology
from inventories import ROOT
from pdctl import inventory


def b300():
    return copy.deepcopy(hwprofile.B300_DEFAULT)


def test_emulated_b300_has_one_connectx8_per_gpu_and_switch_management_connectx7():
    topo = nv.parse_topo_matrix(emulate(["topo", "-m"])[1])
    legend = topo["nic_names"]
    assert len(legend) == 12
    by_name = {n["name"]: n for n in hwprofile.nic_entries(b300())}
    for g in range(8):
        pix = [legend[nic] for nic, cell in topo["matrix"]["GPU%d" % g].items()
               if nic.startswith("NIC") and cell in ("PIX", "PXB")]
        assert len(pix) == 1 and by_name[pix[0]]["device"] == "MT4131", (g, pix)  # ConnectX-8
    mgmt = sorted(n for n, e in by_name.items() if e["role"] == "switch_mgmt")
    assert mgmt == ["mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5"] and {by_name[n]["device"] for n in mgmt} == {"MT4129"}
    assert topo["affinity"]["GPU0"]["numa"] == "0" and topo["affinity"]["GPU4"]["numa"] == "1"


def test_placement_never_picks_a_switch_management_port():
    prof = b300()
    place = hwprofile.placement(prof, [0, 1, 2, 3])
    assert place == {"nics": ["mlx5_0", "mlx5_1", "mlx5_6", "mlx5_7"], "numa_nodes": [0],
                     "cpu_affinity": "0-55,112-167"}
    # A GPU without its own NIC takes the KV NICs of its socket, still never a management port.
    prof["nics"] = [n for n in prof["nics"] if n["name"] != "mlx5_8"]
    assert hwprofile.placement(prof, [4])["nics"] == ["mlx5_9", "mlx5_10", "mlx5_11"]
    prof["nics"] = [n for n in prof["nics"] if n["role"] == "switch_mgmt"]
    with pytest.raises(hwprofile.ProfileError, match="GPU 4 .*no KV NIC"):
        hwprofile.placement(prof, [4])


def test_plan_names_the_instance_whose_gpus_have_no_kv_nic():
    hosts = inventory.load(ROOT / "inventories/b300")
    only_mgmt = [n for n in b300()["nics"] if n["role"] == "switch_mgmt"]
    hosts["b300-prefill-1"]["vars"]["pdctl_hw_profile"] = {"nics": only_mgmt}
    with pytest.raises(topology.PlanError) as err:
        topology.build_plan(hosts)
    assert any(p.startswith("b300-prefill-1 prefill-2: GPU 0") for p in err.value.problems), err.value.problems


def test_plan_follows_a_sites_own_nic_numbering():
    hosts = inventory.load(ROOT / "inventories/b300")
    nics = [{"name": "mlx5_%d" % g, "device": "MT4131", "numa": g // 4, "gpu": g} for g in range(8)]
    for h in hosts.values():
        h["vars"]["pdctl_hw_profile"] = {"nics": nics}
    plan = topology.build_plan(hosts)
    p1 = next(i for i in plan["instances"] if i["name"] == "prefill-1")
    assert p1["ucx_net_devices"] == "mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1" and p1["numa_nodes"] == [1]


def _state(host_profile, expected):
    _, topo = emulate(["topo", "-m"], host_profile)
    _, q = emulate(["--query-gpu=" + ",".join(hwcheck.QUERY_FIELDS), "--format=csv"], host_profile)
    return hwcheck.check_state("h", expected, nv.parse_query_csv(q), {}, {}, nv.parse_topo_matrix(topo))[1]


def test_nvlink_check_fails_a_host_whose_nics_are_not_where_the_plan_assumes():
    host = b300()
    host["nics"][0]["gpu"], host["nics"][1]["gpu"] = 1, 0          # mlx5_0 sits by GPU 1 on this host
    failures = _state(host, dict(b300(), nvlink={"links_per_gpu": 0, "peer_connection": None}))
    assert any("GPU0 <-> mlx5_0 (NIC0): NODE, expected PIX or PXB" in f for f in failures), failures


def test_nvlink_check_fails_a_host_without_the_profiles_nics_or_cpus():
    host = b300()
    host["nics"] = [n for n in host["nics"] if n["name"] != "mlx5_9"]
    host["gpu"]["cpu_affinity"] = ["0-111"] * 8
    failures = _state(host, dict(b300(), nvlink={"links_per_gpu": 0, "peer_connection": None}))
    assert any("ConnectX-8 mlx5_9 is not in the `nvidia-smi topo -m` NIC legend" in f for f in failures), failures
    assert any("GPU4: CPU affinity 0-111, expected 56-111,168-223" in f for f in failures), failures


def test_nvlink_check_passes_the_emulated_b300():
    assert _state(b300(), dict(b300(), nvlink={"links_per_gpu": 0, "peer_connection": None})) == []
