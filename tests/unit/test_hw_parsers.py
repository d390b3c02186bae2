"""Parsers on the real H200/H100 captures and on the emulator's B300 output (same code path)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hw_support import FAKE_COMMANDS, FIXTURES, emulate, fake, profile

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import hwprofile, nvsmi as nv

H200 = FIXTURES / "h200-x1"
B300 = FIXTURES / "b300-emulated"


def section(text, title):
    return text.split(f"### {title}\n", 1)[1].split("\nrc=", 1)[0]


def test_h200_xml():
    parsed = nv.parse_query_xml((H200 / "nvidia-smi-q.xml").read_text())
    assert parsed["driver_version"] == "580.159.04" and parsed["cuda_version"] == "13.0"
    gpu = parsed["gpus"][0]
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["uuid"] == "GPU-9e26689a-bf03-77ee-4c02-ac0e154944a2"
    assert gpu["pci_bus_id"] == "00000000:00:06.0"
    assert gpu["ecc_mode"] == "Enabled" and gpu["ecc_volatile_uncorrected"] == 0
    assert gpu["pcie"] == {"gen_current": 5, "gen_max": 5, "width_current": 16, "width_max": 16}
    assert gpu["fabric"]["state"] == "N/A"
    assert gpu["remapped_rows"]["uncorrectable"] == 0 and gpu["memory_total_mib"] == 143771


def test_h200_topo_strips_ansi_and_nvlink_empty():
    text = (H200 / "nvlink.txt").read_text()
    topo = nv.parse_topo_matrix(section(text, "nvidia-smi topo -m"))
    assert topo["devices"] == ["GPU0"]
    assert topo["affinity"]["GPU0"] == {"cpu": "0-15", "numa": "0", "gpu_numa_id": "N/A"}
    assert nv.parse_nvlink_status(section(text, "nvidia-smi nvlink --status")) == {}
    rows = nv.parse_query_csv(section(text, "query"))
    assert rows[0]["memory.total"] == "143771 MiB" and rows[0]["fabric.state"] == "N/A"
    assert nv.parse_version(section(text, "nvidia-smi --version"))["driver_version"] == "580.159.04"


def test_h100_capture_from_device_run():
    text = (FIXTURES / "h100-x1" / "captures.txt").read_text()
    xml = text.split("### nvidia-smi -q -x\n", 1)[1].split("### nvidia-smi nvlink", 1)[0]
    assert nv.parse_query_xml(xml)["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"


def test_b300_fixtures_are_what_the_emulator_prints(monkeypatch):
    for name, argv in FAKE_COMMANDS.items():
        rc, out = emulate(argv, monkeypatch=monkeypatch)
        assert rc == 0
        assert out == (B300 / name).read_text(), name


def test_b300_parsed():
    xml = nv.parse_query_xml((B300 / "nvidia-smi-q.xml").read_text())
    assert len(xml["gpus"]) == 8 and xml["driver_version"] == "580.95.05"
    assert {g["fabric"]["state"] for g in xml["gpus"]} == {"Completed"}
    assert xml["gpus"][7]["pcie"]["gen_current"] == 6
    status = nv.parse_nvlink_status((B300 / "nvlink-status.txt").read_text())
    assert len(status) == 8 and all(len(g["links"]) == 18 for g in status.values())
    assert status[0]["links"][17] == {"state": "Active", "speed_gbps": 53.125}
    errors = nv.parse_nvlink_errors((B300 / "nvlink-errors.txt").read_text())
    assert errors[3][7] == {"replay_errors": 0, "recovery_errors": 0, "crc_errors": 0}
    topo = nv.parse_topo_matrix((B300 / "topo-m.txt").read_text())
    assert "\x1b" in (B300 / "topo-m.txt").read_text()
    assert nv.link_kinds(topo) == {"NV18": 28}
    assert topo["affinity"]["GPU4"]["numa"] == "1"
    rows = nv.parse_query_csv((B300 / "query.csv").read_text())
    assert [r["fabric.status"] for r in rows] == ["Success"] * 8


@pytest.mark.parametrize("fmt", ["csv", "csv,noheader", "csv,noheader,nounits"])
def test_query_formats(fmt):
    fields = ["index", "memory.total", "fabric.state"]
    rc, out = fake.run(["--query-gpu=" + ",".join(fields), "--format=" + fmt], profile())
    assert rc == 0
    rows = nv.parse_query_csv(out, None if "noheader" not in fmt else fields)
    assert len(rows) == 8
    assert rows[0]["memory.total"] == ("275040" if "nounits" in fmt else "275040 MiB")


def test_emulator_rejects_unknown_field():
    rc, out = fake.run(["--query-gpu=index,bogus", "--format=csv"], profile())
    assert rc == 2 and "bogus" in out


def test_faults_show_in_outputs():
    prof = profile(missing_gpus=[5], links_down=[{"gpu": 3, "link": 7}],
                   nvlink_errors=[{"gpu": 1, "link": 2, "replay": 500}])
    status = nv.parse_nvlink_status(fake.run(["nvlink", "--status"], prof)[1])
    assert len(status) == 7 and status[3]["links"][7]["state"] == "Inactive"
    topo = nv.parse_topo_matrix(fake.run(["topo", "-m"], prof)[1])
    assert topo["matrix"]["GPU3"]["GPU0"] == "NV17" and topo["matrix"]["GPU0"]["GPU1"] == "NV18"
    assert nv.parse_nvlink_errors(fake.run(["nvlink", "-e"], prof)[1])[1][2]["replay_errors"] == 500


def test_emulator_reads_profile_file(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"gpu": {"count": 2}, "nics": ["mlx5_0"]}))
    monkeypatch.setenv("PDCTL_HW_PROFILE", str(path))
    rc, out = fake.run(["topo", "-m"], None)
    topo = nv.parse_topo_matrix(out)
    assert topo["devices"] == ["GPU0", "GPU1", "NIC0"] and topo["nic_names"] == {"NIC0": "mlx5_0"}


def test_one_default_profile_everywhere():
    packaged = json.loads((Path(fake.__file__).parent / "profiles" / "b300.json").read_text())
    assert packaged == fake.DEFAULT_PROFILE == hwprofile.B300_DEFAULT


def test_profile_validation():
    with pytest.raises(hwprofile.ProfileError, match="faults"):
        hwprofile.resolve({"faults": {"melted": True}})
    with pytest.raises(hwprofile.ProfileError, match="gpu.count"):
        hwprofile.resolve({"gpu": {"count": "eight"}})
    assert hwprofile.resolve({"gpu": {"count": 1, "bus_ids": []}})["gpu"]["count"] == 1


# -- the driver's kernel module and user space (the emulator as the nvidia-smi stand-in package installs it) --

def test_installed_emulator_reports_the_loaded_module_version(tmp_path):
    module = tmp_path / "version"
    module.write_text("580.95.05\n")
    rc, out = fake.run(["--query-gpu=driver_version", "--format=csv,noheader"], profile(), library="580.95.05",
                       module_file=str(module))
    assert rc == 0 and set(out.split()) == {"580.95.05"}


def test_installed_emulator_refuses_a_module_of_another_release_as_nvml_does(tmp_path):
    module = tmp_path / "version"
    module.write_text("580.95.05\n")  # the upgrade installed 580.105.08; the old module stays until a reboot
    rc, out = fake.run([], profile(), library="580.105.08", module_file=str(module))
    assert rc == 18
    assert out.startswith("Failed to initialize NVML: Driver/library version mismatch")
    rc, out = fake.run([], profile(), library="580.105.08", module_file=str(tmp_path / "none"))
    assert rc == 9 and "couldn't communicate with the NVIDIA driver" in out


def test_faults_of_one_driver_release_apply_only_when_it_is_loaded(tmp_path):
    prof = fake._merge(profile(), {"faults_by_driver": {"580.105.08": {"links_down": [{"gpu": 2, "link": 7}]}}})
    module = tmp_path / "version"
    for loaded, down in (("580.95.05", 0), ("580.105.08", 1)):
        module.write_text(loaded)
        rc, out = fake.run(["nvlink", "--status"], prof, library=loaded, module_file=str(module))
        assert rc == 0 and out.count("<inactive>") == down, loaded
