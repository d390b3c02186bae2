#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU facts from nvidia-smi (and NVML when available)
description:
  - Runs C(nvidia-smi -q -x) and parses the XML (DTD nvsmi_device_v13) into one record per GPU.
  - When the Python NVML binding (nvidia-ml-py, C(pynvml)) is importable, adds what the XML lacks
    (active NVLink count per GPU, NUMA node from NVML when sysfs has none).
  - The NUMA node is read from C(/sys/bus/pci/devices/<bus id>/numa_node).
  - Read-only; works the same on real hosts and on lab hosts with the pdctl nvidia-smi emulator.
options:
  use_nvml:
    description: Query NVML through C(pynvml) when it is importable.
    type: bool
    default: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - pdctl.vllm_pd.attributes
  - pdctl.vllm_pd.host_label
  - pdctl.vllm_pd.nvidia_smi
"""

EXAMPLES = r"""
- name: Gather GPU facts
  pdctl.vllm_pd.gpu_facts:
    host_label: "{{ inventory_hostname }}"

- name: Show the GPUs
  ansible.builtin.debug:
    msg: "{{ ansible_facts.pdctl_gpus | map(attribute='name') | list }}"
"""

RETURN = r"""
gpus:
  description: One record per GPU, in nvidia-smi order.
  returned: success
  type: list
  elements: dict
  sample:
    - index: 0
      name: NVIDIA H200
      uuid: GPU-9e26689a-bf03-77ee-4c02-ac0e154944a2
      pci_bus_id: "00000000:00:06.0"
      numa_node: 0
      driver_version: 580.159.04
      cuda_version: "13.0"
      ecc_mode: Enabled
      ecc_volatile_uncorrected: 0
      remapped_rows: {correctable: 0, uncorrectable: 0, pending: "No", failure: "No"}
      retired_pages: {single_bit: null, double_bit: null, pending: null}
      persistence_mode: Enabled
      pcie: {gen_current: 5, gen_max: 5, width_current: 16, width_max: 16}
      fabric: {state: N/A, status: N/A, clique_id: null, cluster_uuid: null, health: null}
driver_version:
  description: NVIDIA driver version.
  returned: success
  type: str
  sample: 580.159.04
cuda_version:
  description: Highest CUDA version the driver supports.
  returned: success
  type: str
  sample: "13.0"
gpu_count:
  description: Number of GPUs nvidia-smi lists.
  returned: success
  type: int
  sample: 8
nvml:
  description: Whether NVML was queried.
  returned: success
  type: bool
ansible_facts:
  description: The same data as facts C(pdctl_gpus), C(pdctl_gpus_found), C(pdctl_gpu_driver_version), C(pdctl_gpu_cuda_version).
  returned: success
  type: dict
"""

import socket

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.nvsmi import parse_query_xml


def build_module():
    return AnsibleModule(
        argument_spec=dict(
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            use_nvml=dict(type="bool", default=True),
            host_label=dict(type="str"),
        ),
        supports_check_mode=True,
    )


def sysfs_numa_node(bus_id):
    """'00000000:17:00.0' -> /sys/bus/pci/devices/0000:17:00.0/numa_node (-1 means none)."""
    path = "/sys/bus/pci/devices/%s/numa_node" % bus_id[-12:].lower()
    try:
        with open(path) as handle:
            value = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def nvml_extras(count):
    """Per-GPU extras from NVML; {} when pynvml is missing or NVML cannot start."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except Exception:
        return {}
    extras = {}
    try:
        for index in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            active = 0
            for link in range(18):
                try:
                    active += 1 if pynvml.nvmlDeviceGetNvLinkState(handle, link) else 0
                except pynvml.NVMLError:  # 'Not Supported' on GPUs without NVLink
                    break
            info = {"nvlink_active": active}
            try:
                info["numa_node"] = pynvml.nvmlDeviceGetNumaNodeId(handle)
            except (AttributeError, pynvml.NVMLError):
                pass
            extras[index] = info
    finally:
        pynvml.nvmlShutdown()
    return extras


def main():
    module = build_module()
    module.run_command_environ_update = {"LANGUAGE": "C", "LC_ALL": "C"}
    host = module.params["host_label"] or socket.gethostname()
    smi = module.get_bin_path(module.params["nvidia_smi"]) if "/" not in module.params["nvidia_smi"] \
        else module.params["nvidia_smi"]
    if not smi:
        module.fail_json(msg="%s: nvidia-smi not found (%s), expected the NVIDIA driver utilities"
                         % (host, module.params["nvidia_smi"]))
    rc, out, err = module.run_command([smi, "-q", "-x"])
    if rc != 0:
        module.fail_json(msg="%s: nvidia-smi -q -x exited %d: %s" % (host, rc, (err or out).strip()),
                         rc=rc, stdout=out, stderr=err)
    try:
        parsed = parse_query_xml(out)
    except Exception as exc:
        module.fail_json(msg="%s: cannot parse nvidia-smi -q -x output: %s" % (host, exc), stdout=out)
    gpus = parsed["gpus"]
    extras = nvml_extras(len(gpus)) if module.params["use_nvml"] else {}
    for gpu in gpus:
        gpu["numa_node"] = sysfs_numa_node(gpu["pci_bus_id"] or "")
        extra = extras.get(gpu["index"], {})
        if gpu["numa_node"] is None and extra.get("numa_node") is not None:
            gpu["numa_node"] = extra["numa_node"]
        if "nvlink_active" in extra:
            gpu["nvlink_active"] = extra["nvlink_active"]
    facts = {
        "pdctl_gpus": gpus,
        "pdctl_gpus_found": len(gpus),
        "pdctl_gpu_driver_version": parsed["driver_version"],
        "pdctl_gpu_cuda_version": parsed["cuda_version"],
    }
    module.exit_json(changed=False, ansible_facts=facts, gpus=gpus, gpu_count=len(gpus),
                     driver_version=parsed["driver_version"], cuda_version=parsed["cuda_version"],
                     nvml=bool(extras))


if __name__ == "__main__":
    main()
