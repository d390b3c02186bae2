#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: kv_path_check
short_description: Measure the NIXL KV-cache path (bandwidth, latency, UCX transports) for real
description:
  - Runs a real NIXL transfer (UCX backend) as vLLM's NixlConnector does, under the interpreter given in
    I(python) (the serving venv, which has nixl, and torch for GPU memory).
  - C(role=loopback) moves a buffer between two agents on this host (GPU memory when a GPU and torch are
    there, host memory otherwise). C(role=listener) registers a buffer and waits for one initiator on
    I(port); C(role=initiator) connects to the listener on I(peer), exchanges NIXL metadata over that TCP
    connection and pulls (C(op=READ), as decode pulls from prefill) or pushes (C(op=WRITE)) the data.
  - Reports bandwidth (GB/s, median of the timed transfers), latency of a 4 KiB transfer, and the UCX
    transports UCX chose for the data (from the C(UCX_PROTO_INFO=y) tables).
  - Fails when the data does not arrive intact, below I(min_bandwidth_gbps), and when I(expect_rdma) is set
    but UCX chose TCP (or nothing RDMA).
  - Moves data between buffers it allocates itself and changes nothing on the host.
options:
  role:
    description: Which side of the transfer this host plays.
    type: str
    choices: [loopback, listener, initiator]
    default: loopback
  mem:
    description: Memory to move; C(auto) picks VRAM when torch sees a GPU, else DRAM.
    type: str
    choices: [auto, DRAM, VRAM]
    default: auto
  op:
    description: NIXL operation the initiator posts.
    type: str
    choices: [READ, WRITE]
    default: READ
  size_mb:
    description: Size of one transfer in MiB (listener and loopback; the initiator takes the listener's).
    type: int
    default: 256
  iterations:
    description: Timed transfers after one warm-up transfer.
    type: int
    default: 5
  gpu:
    description: CUDA device of this side's buffer (VRAM).
    type: int
    default: 0
  peer_gpu:
    description: Loopback only, CUDA device of the target buffer (default the same as I(gpu)).
    type: int
  peer:
    description: Host name or address of the listener (initiator).
    type: str
  bind:
    description: Address the listener binds its control socket to.
    type: str
    default: 0.0.0.0
  port:
    description:
      - TCP port of the listener's control socket (metadata exchange); required for C(role=listener) and
        C(role=initiator), unused by C(role=loopback).
      - The KV-path check passes the planned ones, from C(pdctl_ports.kv_path_check) up.
    type: int
  timeout:
    description: Seconds the listener waits for an initiator, and the limit for each transfer.
    type: float
    default: 120
  min_bandwidth_gbps:
    description: Lowest accepted bandwidth in GB/s (1 GB = 1e9 bytes).
    type: float
    default: 10.0
  expect_rdma:
    description: Fail unless UCX carried the data over an RDMA transport (rc_mlx5, dc_mlx5, rc_verbs, ...).
    type: bool
    default: false
  ucx_env:
    description: Extra environment for the transfer, e.g. C(UCX_TLS), C(UCX_NET_DEVICES), C(UCX_RNDV_THRESH).
    type: dict
    default: {}
  python:
    description:
      - Interpreter that can import nixl (and torch for VRAM).
      - The serving venv's, C(bin/python) under C(current) in C(pdctl_paths.venvs); playbooks/verify_kv_path.yml passes it.
    type: path
    required: true
  label:
    description:
      - Name of the path in messages and results, replacing the default C(host -> peer); the KV-path check
        passes the prefill instance, its GPU and NIC and the decode side, so a failure names all of them.
    type: str
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - pdctl.vllm_pd.attributes
  - pdctl.vllm_pd.host_label
"""

EXAMPLES = r"""
- name: Loopback on one host (VRAM on a GPU host)
  pdctl.vllm_pd.kv_path_check:
    python: "{{ pdctl_paths.venvs }}/current/bin/python"
    role: loopback
    min_bandwidth_gbps: 100

- name: Decode host listens (in the background) ...
  pdctl.vllm_pd.kv_path_check:
    python: "{{ pdctl_paths.venvs }}/current/bin/python"
    role: listener
    port: "{{ pdctl_ports.kv_path_check }}"
    host_label: "{{ inventory_hostname }}"
  async: 300
  poll: 0
  register: pdctl_kv_listener
  when: inventory_hostname in groups['decode']

- name: ... and each prefill host pushes to it over RDMA
  pdctl.vllm_pd.kv_path_check:
    python: "{{ pdctl_paths.venvs }}/current/bin/python"
    role: initiator
    op: WRITE
    peer: "{{ hostvars[groups['decode'][0]].ansible_host }}"
    port: "{{ pdctl_ports.kv_path_check }}"
    expect_rdma: true
    min_bandwidth_gbps: 20
    host_label: "{{ inventory_hostname }}"
  when: inventory_hostname in groups['prefill']

- name: Decode pulls GPU 4's blocks from a prefill instance through that instance's NICs
  pdctl.vllm_pd.kv_path_check:
    python: "{{ pdctl_paths.venvs }}/current/bin/python"
    role: initiator
    op: READ
    mem: VRAM
    gpu: 4
    peer: 192.0.2.11
    port: 5691
    expect_rdma: true
    min_bandwidth_gbps: 20
    ucx_env: {UCX_NET_DEVICES: "mlx5_8:1,mlx5_9:1,mlx5_10:1,mlx5_11:1"}
    label: b300-prefill-0 prefill-1 GPU 4 (NIC mlx5_8) -> b300-decode-0 decode-0 GPU 4
"""

RETURN = r"""
bandwidth_gbps:
  description: Median bandwidth of the timed transfers, GB/s.
  returned: when a transfer ran
  type: float
  sample: 38.2
latency_us:
  description: Median time of a 4 KiB transfer, microseconds.
  returned: when a transfer ran
  type: float
transports:
  description: UCX transport/device pairs that served the data operation at this size.
  returned: when a transfer ran
  type: list
  elements: str
  sample: [rc_mlx5/mlx5_0:1]
label:
  description: The path's name as used in messages (I(label), else C(host -> peer)).
  returned: always
  type: str
  sample: b300-prefill-0 prefill-1 GPU 4 (NIC mlx5_8) -> b300-decode-0 decode-0 GPU 4
transfer:
  description: The full worker result (role, mem, op, size_bytes, seconds, best_gbps, data_ok, agent, peer).
  returned: always
  type: dict
failures:
  description: One message per failed expectation (empty on success).
  returned: always
  type: list
  elements: str
"""

import inspect
import json
import os
import socket

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import kvpath
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.kvpath import judge, parse_proto_info, transports_used


def build_module():
    return AnsibleModule(
        argument_spec=dict(
            role=dict(type="str", choices=["loopback", "listener", "initiator"], default="loopback"),
            mem=dict(type="str", choices=["auto", "DRAM", "VRAM"], default="auto"),
            op=dict(type="str", choices=["READ", "WRITE"], default="READ"),
            size_mb=dict(type="int", default=256),
            iterations=dict(type="int", default=5),
            gpu=dict(type="int", default=0),
            peer_gpu=dict(type="int"),
            peer=dict(type="str"),
            bind=dict(type="str", default="0.0.0.0"),
            port=dict(type="int"),
            timeout=dict(type="float", default=120.0),
            min_bandwidth_gbps=dict(type="float", default=10.0),
            expect_rdma=dict(type="bool", default=False),
            ucx_env=dict(type="dict", default={}),
            python=dict(type="path", required=True),
            host_label=dict(type="str"),
            label=dict(type="str"),
        ),
        required_if=[("role", "listener", ("port",)), ("role", "initiator", ("peer", "port"))],
        supports_check_mode=True,
    )


def worker_command(p, script, result_file):
    cmd = [p["python"], script, p["role"], "--mem", p["mem"], "--size-mb", str(p["size_mb"]), "--op", p["op"],
           "--iterations", str(p["iterations"]), "--gpu", str(p["gpu"]),
           "--bind", p["bind"], "--timeout", str(p["timeout"]), "--result-file", result_file]
    if p["port"] is not None:
        cmd += ["--port", str(p["port"])]
    if p["peer"]:
        cmd += ["--peer", p["peer"]]
    if p["peer_gpu"] is not None:
        cmd += ["--peer-gpu", str(p["peer_gpu"])]
    return cmd


def main():
    module = build_module()
    module.run_command_environ_update = {"LANGUAGE": "C", "LC_ALL": "C"}
    p = module.params
    host = p["host_label"] or socket.gethostname()
    where = "%s -> %s" % (host, p["peer"]) if p["role"] == "initiator" else (
        "%s (listener)" % host if p["role"] == "listener" else "%s loopback" % host)
    if p["label"]:
        where = p["label"]
    if not os.path.exists(p["python"]):
        module.fail_json(msg="%s: interpreter %s not found, expected the serving venv's python (with nixl)"
                         % (host, p["python"]))
    script = os.path.join(module.tmpdir, "kvpath.py")
    with open(script, "w") as handle:
        handle.write(inspect.getsource(kvpath))
    result_file = os.path.join(module.tmpdir, "kvpath-result.json")
    env = {"UCX_PROTO_INFO": "y"}  # UCX prints which transport serves each operation: our evidence
    env.update({str(k): str(v) for k, v in p["ucx_env"].items()})
    rc, out, err = module.run_command(worker_command(p, script, result_file), environ_update=env)
    try:
        with open(result_file) as handle:
            transfer = json.load(handle)
    except (OSError, ValueError):
        module.fail_json(msg="%s: NIXL transfer worker exited %d without a result: %s" % (where, rc, (err or out)[-2000:]),
                         rc=rc, stdout=out[-20000:], stderr=err[-20000:], failures=[], transfer={})
    result = {"changed": False, "transfer": transfer, "label": where}
    if p["role"] != "listener":
        blocks = parse_proto_info(out + "\n" + err)
        transports = transports_used(blocks, transfer.get("agent"), transfer.get("op") or p["op"],
                                     transfer.get("size_bytes") or 0)
        transfer["transports"] = transports
        result.update(transports=transports, bandwidth_gbps=transfer.get("bandwidth_gbps"),
                      latency_us=transfer.get("latency_us"))
        failures = judge(transfer, p["min_bandwidth_gbps"], p["expect_rdma"], where)
    else:
        failures = [] if transfer.get("data_ok") else [
            "%s: %s" % (where, transfer.get("error") or "transfer did not complete")]
        result.update(bandwidth_gbps=transfer.get("bandwidth_gbps"), latency_us=transfer.get("latency_us"))
    if transfer.get("error") and not failures:
        failures.append("%s: %s" % (where, transfer["error"]))
    result["failures"] = failures
    if failures:
        module.fail_json(msg="; ".join(failures), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
