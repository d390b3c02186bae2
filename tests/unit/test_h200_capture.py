"""Issue 13 item 9: the parsers and checks on a real capture, two H200 on NVLink (tests/fixtures/hw/h200-x2,
driver 580.159.04, CUDA 13.0; copied from ../shared/hw/h200-x2/, see its README)."""
import json
import re

from test_hw_support import FIXTURES  # noqa: F401  (sets up ansible.module_utils)

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import hwcheck, hwprofile, kvpath, nvsmi as nv

CAP = FIXTURES / "h200-x2"
TEXT = (CAP / "captures.txt").read_text()
# An H200 pair as its own profile: 18 NVLink links at 26.562 GB/s, NV18, no NVSwitch fabric, no NICs.
H200 = hwprofile.resolve({
    "name": "h200-x2", "driver_version": "580.159.04", "cuda_version": "13.0",
    "gpu": {"count": 2, "name": "NVIDIA H200", "memory_mib": 143771, "bus_ids": ["00000000:00:06.0", "00000000:00:07.0"],
            "numa_nodes": [0, 0], "cpu_affinity": ["0-31", "0-31"]},
    "nvlink": {"version": 4, "links_per_gpu": 18, "link_speed_gbps": 26.562, "peer_connection": "NV18"},
    "fabric": {"state": None}, "nics": []})


def topo_text():
    start = TEXT.index("\t\x1b[4mGPU0") if "\t\x1b[4mGPU0" in TEXT else TEXT.index("GPU0\tGPU1")
    return TEXT[TEXT.rfind("\n", 0, start) + 1:TEXT.index("GPU 0: NVIDIA H200")]


def nvlink_text():
    start = TEXT.index("GPU 0: NVIDIA H200")
    lines = []
    for line in TEXT[start:].splitlines():
        if line.startswith("GPU ") or re.match(r"^\s+Link \d+:", line):
            lines.append(line)
        elif lines:
            break
    return "\n".join(lines) + "\n"


def test_query_xml_of_two_h200():
    xml = nv.parse_query_xml((CAP / "q.xml").read_text())
    assert xml["driver_version"] == "580.159.04" and xml["cuda_version"] == "13.0"
    assert [g["name"] for g in xml["gpus"]] == ["NVIDIA H200", "NVIDIA H200"]
    assert [g["pci_bus_id"] for g in xml["gpus"]] == ["00000000:00:06.0", "00000000:00:07.0"]
    assert {g["persistence_mode"] for g in xml["gpus"]} == {"Enabled"}
    assert {g["memory_total_mib"] for g in xml["gpus"]} == {143771}
    assert {g["ecc_volatile_uncorrected"] for g in xml["gpus"]} == {0}


def test_gpu_facts_as_the_module_returned_it_agree_with_the_parser():
    facts = json.loads((CAP / "gpu_facts.json").read_text())
    xml = nv.parse_query_xml((CAP / "q.xml").read_text())
    assert facts["gpu_count"] == 2 and facts["driver_version"] == xml["driver_version"]
    assert [g["uuid"] for g in facts["gpus"]] == [g["uuid"] for g in xml["gpus"]]


def test_topology_and_links_of_two_h200():
    topo = nv.parse_topo_matrix(topo_text())
    assert topo["matrix"]["GPU0"]["GPU1"] == "NV18" and topo["nic_names"] == {}
    assert topo["affinity"]["GPU1"] == {"cpu": "0-31", "numa": "0", "gpu_numa_id": "N/A"}
    status = nv.parse_nvlink_status(nvlink_text())
    assert sorted(status) == [0, 1]
    for gpu in status.values():
        assert len(gpu["links"]) == 18
        assert {link["speed_gbps"] for link in gpu["links"].values()} == {26.562}


def _rows():
    xml = nv.parse_query_xml((CAP / "q.xml").read_text())
    return [{"index": str(g["index"]), "uuid": g["uuid"], "pci.bus_id": g["pci_bus_id"],
             "driver_version": xml["driver_version"], "fabric.state": g["fabric"]["state"],
             "fabric.status": g["fabric"]["status"], "ecc.mode.current": g["ecc_mode"],
             "ecc.errors.uncorrected.volatile.total": str(g["ecc_volatile_uncorrected"])} for g in xml["gpus"]]


def test_nvlink_check_passes_the_h200_pair_against_an_h200_profile():
    report, failures = hwcheck.check_state("h200", H200, _rows(), nv.parse_nvlink_status(nvlink_text()), {},
                                                 nv.parse_topo_matrix(topo_text()))
    assert failures == [] and report["link_kinds"] == {"NV18": 1}


def test_nvlink_check_names_every_slow_link_against_the_b300_speed():
    b300_speed = hwprofile.merge(H200, {"nvlink": {"link_speed_gbps": 53.125}})
    _, failures = hwcheck.check_state("h200", b300_speed, _rows(), nv.parse_nvlink_status(nvlink_text()), {},
                                            nv.parse_topo_matrix(topo_text()))
    assert len(failures) == 36 and "h200 GPU 1 link 17: speed 26.562 GB/s, expected 53.125 GB/s" in failures


def _kv_results():
    """kv.jsonl: one {"variant", "ucx_env", "result"} record per variant, the result spanning lines."""
    decoder, text, out, pos = json.JSONDecoder(), (CAP / "kv.jsonl").read_text(), [], 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return out
        record, pos = decoder.raw_decode(text, pos)
        out.append(record)


def test_real_nixl_vram_read_between_two_gpus_is_judged_healthy_for_nvlink_and_not_rdma():
    results = _kv_results()
    assert len(results) == 3
    for record in results:
        transfer = record["result"]["transfer"]
        assert transfer["op"] == "READ" and transfer["mem"] == "VRAM" and transfer["data_ok"]
        assert 265 <= transfer["bandwidth_gbps"] <= 295 and transfer["transports"] == ["cuda_ipc/cuda"]
        # A floor far under the measured NVLink READ passes; the same transfer is not an RDMA path.
        assert kvpath.judge(transfer, 200, False, "gpu0 -> gpu1") == []
        failures = kvpath.judge(transfer, 200, True, "gpu0 -> gpu1")
        assert len(failures) == 1 and "UCX chose cuda_ipc/cuda" in failures[0]
