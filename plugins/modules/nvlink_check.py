#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvlink_check
short_description: Check GPUs, NVLinks and the NVLink fabric against an expected hardware profile
description:
  - C(mode=state) reads C(nvidia-smi nvlink --status), C(nvidia-smi nvlink -e), C(nvidia-smi topo -m),
    C(nvidia-smi --version) and C(nvidia-smi --query-gpu=...,fabric.state,fabric.status --format=csv) and
    compares GPU count, driver version, link state and speed, link error counters, the topology matrix,
    fabric state and volatile ECC errors with the expected profile.
  - C(mode=bandwidth) measures peer-to-peer copy bandwidth between every GPU pair with torch, run by
    the interpreter given in I(python), against I(min_bandwidth_gbps).
  - Whatever the machine (one GPU, PCIe, NVSwitch), the module reports what it found (topology matrix,
    links per GPU, connection kinds) and fails with one message per deviation naming host, GPU, link or
    peer, and expected versus found.
  - The expected profile has the format of docs/hardware-profile.md (the lab emulator's format); only
    the fields given override the HGX B300 default; its C(faults) section is ignored here.
  - Read-only.
options:
  mode:
    description: What to check.
    type: str
    choices: [state, bandwidth]
    default: state
  profile:
    description: Expected hardware profile, merged over the HGX B300 default (8 GPUs, 18 NVLink 5 links, NV18, fabric Completed/Success).
    type: dict
    default: {}
  thresholds:
    description:
      - Highest accepted value per counter, for the keys C(replay_errors), C(recovery_errors), C(crc_errors)
        (per link) and C(ecc_volatile_uncorrected) (per GPU). Defaults 100, 0, 100, 0.
    type: dict
    default: {}
  fabric_manager_version:
    description: Version of nvidia-fabricmanager found by the caller; when set it must equal the driver version.
    type: str
  min_bandwidth_gbps:
    description: Lowest accepted P2P copy bandwidth per GPU pair in GB/s (bandwidth mode).
    type: float
    default: 300.0
  size_mb:
    description: Bytes copied per transfer in bandwidth mode, in MiB.
    type: int
    default: 256
  python:
    description:
      - Interpreter with torch, used in bandwidth mode (and required there), e.g. the serving venv's, C(bin/python)
        under C(current) in C(pdctl_paths.venvs).
    type: path
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - pdctl.vllm_pd.attributes
  - pdctl.vllm_pd.host_label
  - pdctl.vllm_pd.nvidia_smi
"""

EXAMPLES = r"""
- name: NVLink and fabric state against the B300 profile
  pdctl.vllm_pd.nvlink_check:
    mode: state
    host_label: "{{ inventory_hostname }}"
    fabric_manager_version: "{{ pdctl_fm_version | default(omit) }}"

- name: A 1-GPU box, expect one GPU and no NVLinks, just report
  pdctl.vllm_pd.nvlink_check:
    profile: {gpu: {count: 1}, nvlink: {links_per_gpu: 0, peer_connection: null}, fabric: {state: null}}

- name: P2P bandwidth between all pairs
  pdctl.vllm_pd.nvlink_check:
    mode: bandwidth
    min_bandwidth_gbps: 500
    python: "{{ pdctl_paths.venvs }}/current/bin/python"
"""

RETURN = r"""
report:
  description: What was found, whatever the machine.
  returned: always
  type: dict
  sample:
    gpu_count: 8
    driver_version: 580.95.05
    link_kinds: {NV18: 28}
    links_per_gpu: {"0": {total: 18, active: 18}}
    topology: {GPU0: {GPU0: X, GPU1: NV18}}
    nic_names: {}
    gpus: [{index: 0, uuid: GPU-..., fabric_state: Completed, fabric_status: Success, ecc_volatile_uncorrected: 0}]
failures:
  description: One message per deviation from the profile (empty on success).
  returned: always
  type: list
  elements: str
  sample: ["decode-0 GPU 3 link 7: state Inactive, expected Active"]
bandwidth:
  description: P2P measurement (bandwidth mode) with C(pairs) [{src, dst, gbps, peer_access}] and C(local_copy_gbps).
  returned: when mode is bandwidth
  type: dict
profile:
  description: The expected profile used (defaults merged).
  returned: always
  type: dict
"""

import inspect
import json
import os
import socket

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import hwbench
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.hwcheck import QUERY_FIELDS, check_bandwidth, check_state
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.hwprofile import ProfileError, resolve
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.nvsmi import (
    parse_nvlink_errors, parse_nvlink_status, parse_query_csv, parse_topo_matrix, parse_version)


def build_module():
    return AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", choices=["state", "bandwidth"], default="state"),
            profile=dict(type="dict", default={}),
            thresholds=dict(type="dict", default={}),
            fabric_manager_version=dict(type="str"),
            min_bandwidth_gbps=dict(type="float", default=300.0),
            size_mb=dict(type="int", default=256),
            python=dict(type="path"),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            host_label=dict(type="str"),
        ),
        required_if=[("mode", "bandwidth", ("python",))],
        supports_check_mode=True,
    )


def main():
    module = build_module()
    module.run_command_environ_update = {"LANGUAGE": "C", "LC_ALL": "C"}
    p = module.params
    host = p["host_label"] or socket.gethostname()
    try:
        profile = resolve(p["profile"])
    except ProfileError as exc:
        module.fail_json(msg="%s: %s" % (host, exc))
    smi = p["nvidia_smi"] if "/" in p["nvidia_smi"] else module.get_bin_path(p["nvidia_smi"])
    if not smi:
        module.fail_json(msg="%s: nvidia-smi not found, expected the NVIDIA driver utilities" % host)

    def smi_out(args, allow_fail=False):
        rc, out, err = module.run_command([smi] + args)
        if rc != 0 and not allow_fail:
            module.fail_json(msg="%s: nvidia-smi %s exited %d: %s" % (host, " ".join(args), rc, (err or out).strip()),
                             rc=rc, stdout=out, stderr=err, profile=profile)
        return out if rc == 0 else ""

    result = {"changed": False, "profile": profile}
    if p["mode"] == "state":
        query = parse_query_csv(smi_out(["--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits"]),
                                QUERY_FIELDS)
        report, failures = check_state(
            host, profile, query,
            parse_nvlink_status(smi_out(["nvlink", "--status"], allow_fail=True)),
            parse_nvlink_errors(smi_out(["nvlink", "-e"], allow_fail=True)),
            parse_topo_matrix(smi_out(["topo", "-m"], allow_fail=True)),
            version=parse_version(smi_out(["--version"], allow_fail=True)),
            thresholds=p["thresholds"], fabric_manager_version=p["fabric_manager_version"])
    else:
        if not os.path.exists(p["python"]):
            module.fail_json(msg="%s: interpreter %s not found, expected the serving venv's python (with torch)"
                             % (host, p["python"]), profile=profile)
        script = os.path.join(module.tmpdir, "hwbench.py")
        with open(script, "w") as handle:
            handle.write(inspect.getsource(hwbench))
        rc, out, err = module.run_command([p["python"], script, str(p["size_mb"])])
        line = next((x for x in out.splitlines() if x.startswith("PDCTL_HWBENCH ")), None)
        if rc != 0 or line is None:
            module.fail_json(msg="%s: P2P bandwidth measurement failed (rc %d): %s" % (host, rc, (err or out)[-2000:]),
                             rc=rc, stdout=out, stderr=err, profile=profile)
        report, failures = check_bandwidth(host, profile, json.loads(line.split(" ", 1)[1]), p["min_bandwidth_gbps"])
        result["bandwidth"] = report
        report = {"gpu_count": report.get("device_count"), "devices": report.get("devices")}
    result.update(report=report, failures=failures)
    if failures:
        module.fail_json(msg="; ".join(failures), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
