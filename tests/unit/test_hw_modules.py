"""nvlink_check / gpu_facts as modules (patch_module_args, exit/fail raise), one test per failure
message, run against the emulator as an `nvidia-smi` executable - the path lab hosts take."""
from __future__ import annotations

import pytest
from module_harness import load
from test_hw_support import fake_bin, profile

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args


class ExitJson(Exception):
    pass


class FailJson(Exception):
    pass


@pytest.fixture(autouse=True)
def raising_exits(monkeypatch):
    def exit_json(self, **kwargs):
        raise ExitJson(kwargs)

    def fail_json(self, **kwargs):
        raise FailJson(kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)


def run(name, args, expect=ExitJson):
    with patch_module_args(args), pytest.raises(expect) as caught:
        load(name).main()
    return caught.value.args[0]


def nvlink(tmp_path, prof, **args):
    smi = fake_bin(tmp_path, prof)
    return dict(nvidia_smi=str(smi), host_label="lab-decode-0", **args)


def test_gpu_facts_on_emulated_b300(tmp_path):
    out = run("gpu_facts", {"nvidia_smi": str(fake_bin(tmp_path, profile())), "use_nvml": False})
    assert out["gpu_count"] == 8 and out["driver_version"] == "580.95.05"
    assert out["ansible_facts"]["pdctl_gpus"][3]["fabric"]["state"] == "Completed"
    assert out["gpus"][0]["pcie"]["width_max"] == 16


def test_gpu_facts_missing_binary():
    out = run("gpu_facts", {"nvidia_smi": "no-such-nvidia-smi", "host_label": "lab-prefill-0"}, FailJson)
    assert out["msg"].startswith("lab-prefill-0: nvidia-smi not found")


def test_nvlink_check_healthy_b300(tmp_path):
    out = run("nvlink_check", nvlink(tmp_path, profile()))
    assert out["failures"] == [] and out["report"]["link_kinds"] == {"NV18": 28}
    assert out["report"]["links_per_gpu"][0] == {"total": 18, "active": 18}


@pytest.mark.parametrize("faults, message", [
    ({"missing_gpus": [5]}, "lab-decode-0: 7 GPUs found, expected 8 (missing PCI 00000000:BB:00.0)"),
    ({"links_down": [{"gpu": 3, "link": 7}]}, "lab-decode-0 GPU 3 link 7: state Inactive, expected Active"),
    ({"links_down": [{"gpu": 3, "link": 7}]}, "lab-decode-0 GPU0 <-> GPU3: NV17, expected NV18"),
    ({"link_speed": [{"gpu": 1, "link": 4, "speed_gbps": 26.562}]},
     "lab-decode-0 GPU 1 link 4: speed 26.562 GB/s, expected 53.125 GB/s"),
    ({"fabric": [{"gpu": 2, "state": "In Progress", "status": "N/A"}]},
     "lab-decode-0 GPU 2: fabric state In Progress/status N/A, expected Completed/Success"),
    ({"ecc_errors": [{"gpu": 6, "volatile_uncorrected": 3}]},
     "lab-decode-0 GPU 6: 3 volatile uncorrected ECC errors, expected at most 0"),
    ({"nvlink_errors": [{"gpu": 1, "link": 2, "recovery": 2}]},
     "lab-decode-0 GPU 1 link 2: 2 recovery errors, expected at most 0"),
    ({"driver_version": "580.82.07"}, "lab-decode-0: NVIDIA driver 580.82.07, expected 580.95.05"),
])
def test_nvlink_check_failure_messages(tmp_path, faults, message):
    out = run("nvlink_check", nvlink(tmp_path, profile(**faults)), FailJson)
    assert message in out["failures"]
    assert message in out["msg"] and "report" in out


def test_fabric_manager_version_skew(tmp_path):
    out = run("nvlink_check", nvlink(tmp_path, profile(), fabric_manager_version="580.82.07"), FailJson)
    assert out["failures"] == ["lab-decode-0: nvidia-fabricmanager 580.82.07 does not match driver 580.95.05 "
                               "(they must be the same version)"]


def test_thresholds_option(tmp_path):
    prof = profile(nvlink_errors=[{"gpu": 1, "link": 2, "replay": 50}])
    assert run("nvlink_check", nvlink(tmp_path, prof))["failures"] == []
    out = run("nvlink_check", nvlink(tmp_path, prof, thresholds={"replay_errors": 10}), FailJson)
    assert out["failures"] == ["lab-decode-0 GPU 1 link 2: 50 replay errors, expected at most 10"]


def test_reports_a_one_gpu_box(tmp_path):
    one = {"gpu": {"count": 1, "bus_ids": []}, "nvlink": {"links_per_gpu": 0, "peer_connection": None},
           "fabric": {"state": None}, "nics": []}
    box = dict(profile(), **one)
    out = run("nvlink_check", nvlink(tmp_path, box, profile=one))
    assert out["report"]["gpu_count"] == 1 and out["report"]["topology"] == {"GPU0": {"GPU0": "X"}}


def test_check_mode_runs_read_only(tmp_path):
    out = run("nvlink_check", dict(nvlink(tmp_path, profile()), _ansible_check_mode=True))
    assert out["changed"] is False and out["failures"] == []


def test_bandwidth_mode_low_floor(tmp_path):
    from ansible_collections.pdctl.vllm_pd.plugins.module_utils.hwcheck import check_bandwidth
    result = {"device_count": 2, "pairs": [{"src": 0, "dst": 1, "gbps": 12.5, "peer_access": False},
                                          {"src": 1, "dst": 0, "gbps": 700.0, "peer_access": True}]}
    _, failures = check_bandwidth("lab-prefill-0", {"gpu": {"count": 2}}, result, 300.0)
    assert failures == ["lab-prefill-0 GPU 0 -> GPU 1: 12.5 GB/s, expected at least 300.0 GB/s (peer access False)"]


def test_bandwidth_mode_missing_python(tmp_path):
    out = run("nvlink_check", nvlink(tmp_path, profile(), mode="bandwidth", python="/nope/python"), FailJson)
    assert "interpreter /nope/python not found" in out["msg"]
