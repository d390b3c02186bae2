"""Malformed inventories: each a realistic operator mistake and the words the rejection must contain.

Each case is an override of the lab inventory (see inventories.inventory_variant).
"""

P0, P1, D0 = "lab-prefill-0", "lab-prefill-1", "lab-decode-0"

CASES = [
    ("gpu-overlap",
     {"host_vars/" + P0: {"pdctl_instances": [{"pool": "prefill", "gpus": "0-3"}, {"pool": "prefill", "gpus": "2-5"}]}},
     [P0, "GPU 2 is in both prefill-0 and prefill-1"]),
    ("gpus-beyond-host",
     {"host_vars/" + P1: {"pdctl_gpu_count": 6, "pdctl_instances": [{"pool": "prefill"}, {"pool": "prefill"}]}},
     [P1, "GPUs 6,7 are beyond the host's 6 GPUs"]),
    ("gpus-left-idle",
     {"host_vars/" + P1: {"pdctl_gpu_count": 6}},
     [P1, "GPUs 4,5 would sit idle"]),
    ("gpus-not-tp-times-dp",
     {"host_vars/" + D0: {"pdctl_instances": [{"pool": "decode", "gpus": [0, 1, 2, 3, 4, 5]}]}},
     [D0, "decode-0", "6 GPUs (0,1,2,3,4,5) but TP1 x DP8 needs 8"]),
    ("api-port-clash",
     {"host_vars/" + P0: {"pdctl_instances": [{"pool": "prefill"}, {"pool": "prefill", "api_port": 8100}]}},
     [P0, "port clash", "prefill-0 API port 8100 overlaps prefill-1 API port 8100"]),
    ("side-channel-overlap",
     {"host_vars/" + P1: {"pdctl_instances": [{"pool": "prefill"}, {"pool": "prefill", "side_channel_port": 5602}]}},
     [P1, "prefill-2 NIXL side-channel range 5600-5603 overlaps prefill-3 NIXL side-channel range 5602-5605"]),
    ("rpc-port-vs-router",
     {"host_vars/" + D0: {"pdctl_ports": {"api_base": 8100, "side_channel_base": 5600, "dp_rpc_base": 13345,
                                          "router": 13345, "router_metrics": 29000,
                                          "frontdoor": 8443, "frontdoor_metrics": 8405}}},
     [D0, "decode-0 DP RPC port 13345 overlaps router port 13345"]),
    ("router-metrics-vs-api",
     {"host_vars/" + D0: {"pdctl_ports": {"api_base": 8100, "side_channel_base": 5600, "dp_rpc_base": 13345,
                                          "router": 8000, "router_metrics": 8100,
                                          "frontdoor": 8443, "frontdoor_metrics": 8405}}},
     [D0, "decode-0 API port 8100 overlaps router metrics port 8100"]),
    ("prefill-tp-above-decode",
     {"group_vars/prefill": {"pdctl_pools": {"prefill": {"tensor_parallel_size": 2, "data_parallel_size": 2},
                                             "decode": {"tensor_parallel_size": 1, "data_parallel_size": 8}}}},
     ["prefill TP2 is larger than decode", "TP1"]),
    ("different-models",
     {"group_vars/decode": {"pdctl_model_path": "/mnt/model/glm/GLM-4.6"}},
     ["same model", "/mnt/model/glm/GLM-4.6", "/mnt/model/glm/GLM-5.2-NVFP4"]),
    ("different-vllm-versions",
     {"group_vars/decode": {"pdctl_versions": {"vllm": "0.32.0"}}},
     ["same vLLM version", "0.32.0 vs 0.33.0"]),
    ("no-prefill",
     {"group_vars/prefill": {"pdctl_instances": []}},
     ["no prefill instance"]),
    ("no-decode",
     {"group_vars/decode": {"pdctl_instances": []}},
     ["no decode instance"]),
    ("unknown-pool",
     {"host_vars/" + P0: {"pdctl_instances": [{"pool": "prefil"}, {"pool": "prefill"}]}},
     [P0, "unknown pool 'prefil'"]),
    ("duplicate-hosts",
     {"host_vars/" + P1: {"ansible_host": "10.89.64.11"}},
     ["duplicate host", P0, P1, "10.89.64.11"]),
    ("pool-on-wrong-host",
     {"host_vars/" + D0: {"pdctl_instances": [{"pool": "decode"}, {"pool": "prefill", "gpus": "0-3"}]}},
     [D0, "a prefill instance on a host that is not in the prefill group"]),
    ("no-router",
     {"hosts": {"all": {"children": {
         "serving": {"children": {"prefill": {"hosts": {P0: {"ansible_host": "10.89.64.11"},
                                                        P1: {"ansible_host": "10.89.64.12"}}},
                                  "decode": {"hosts": {D0: {"ansible_host": "10.89.64.13"}}}}}}}}},
     ["router group must hold at least one host, found none"]),
    ("port-not-a-number",
     {"host_vars/" + P0: {"pdctl_instances": [{"pool": "prefill", "api_port": "eighty"}, {"pool": "prefill"}]}},
     [P0, "api_port must be an integer, found 'eighty'"]),
]

CASES.append(
    ("check-port-vs-side-channel",
     {"host_vars/" + D0: {"pdctl_ports": {"api_base": 8100, "side_channel_base": 5600, "dp_rpc_base": 13345,
                                          "router": 8000, "router_metrics": 29000, "kv_path_check": 5605,
                                          "frontdoor": 8443, "frontdoor_metrics": 8405}}},
     [D0, "decode-0 NIXL side-channel range 5600-5607 overlaps kv_path_check port 5605"]))

# Shapes Ansible merges without a word (a host's variables come from every group it is in).
_HOSTS = {P0: {"ansible_host": "10.89.64.11"}, P1: {"ansible_host": "10.89.64.12"}, D0: {"ansible_host": "10.89.64.13"}}
CASES += [
    ("host-in-two-pools",
     {"hosts": {"all": {"children": {
         "serving": {"children": {"prefill": {"hosts": {P0: _HOSTS[P0], P1: _HOSTS[P1]}},
                                  "decode": {"hosts": {D0: _HOSTS[D0], P1: None}}}},
         "router": {"hosts": {D0: None}}}}}},
     [P1, "is in both the decode and prefill groups"]),
    ("host-in-unknown-group",
     {"hosts": {"all": {"children": {
         "serving": {"children": {"prefill": {"hosts": {P0: _HOSTS[P0]}},
                                  "prefil": {"hosts": {P1: _HOSTS[P1]}},
                                  "decode": {"hosts": {D0: _HOSTS[D0]}}}},
         "router": {"hosts": {D0: None}}}}}},
     [P1, "is in group prefil, which the planner does not know"]),
    ("instance-key-nobody-reads",
     {"host_vars/" + P0: {"pdctl_instances": [{"pool": "prefill", "gpu": "0-3"}, {"pool": "prefill"}]}},
     [P0, "instance #0: unknown keys gpu"]),
    ("pool-key-nobody-reads",
     {"group_vars/decode": {"pdctl_pools": {"prefill": {"tensor_parallel_size": 1, "data_parallel_size": 4},
                                            "decode": {"tensor_parallel": 1, "data_parallel_size": 8}}}},
     [D0, "pdctl_pools.decode has unknown keys tensor_parallel"]),
]

# The front door (issue 14): its ports join the clash check on its hosts; its hosts share one port.
_PORTS = {"api_base": 8100, "side_channel_base": 5600, "dp_rpc_base": 13345, "router": 8000, "router_metrics": 29000}
CASES += [
    ("frontdoor-port-vs-router",
     {"host_vars/" + D0: {"pdctl_ports": dict(_PORTS, frontdoor=8000, frontdoor_metrics=8405)}},
     [D0, "router port 8000 overlaps front door port 8000"]),
    ("frontdoor-metrics-vs-api",
     {"host_vars/" + D0: {"pdctl_ports": dict(_PORTS, frontdoor=8443, frontdoor_metrics=8100)}},
     [D0, "decode-0 API port 8100 overlaps front door metrics port 8100"]),
    ("frontdoor-port-missing",
     {"host_vars/" + D0: {"pdctl_ports": _PORTS}},
     [D0, "pdctl_ports.frontdoor is not set", "pdctl_ports.frontdoor_metrics is not set"]),
    ("frontdoor-hosts-disagree",
     {"hosts": {"all": {"children": {
         "serving": {"children": {"prefill": {"hosts": {P0: _HOSTS[P0], P1: _HOSTS[P1]}},
                                  "decode": {"hosts": {D0: _HOSTS[D0]}}}},
         "router": {"hosts": {D0: None}},
         "frontdoor": {"hosts": {D0: None, P0: None}}}}},
      "host_vars/" + P0: {"pdctl_ports": dict(_PORTS, frontdoor=9443, frontdoor_metrics=8405)}},
     ["front-door hosts disagree on pdctl_ports.frontdoor", "8443 on " + D0, "9443 on " + P0]),
    # pdctl_min_prefill_instances (quarantine of prefill hosts that fail their checks): 1..planned prefill.
    ("min-prefill-not-an-integer",
     {"group_vars/all": {"pdctl_min_prefill_instances": "two"}},
     ["pdctl_min_prefill_instances must be an integer from 1 to the 4 planned prefill instances, found 'two'"]),
    ("min-prefill-zero",
     {"group_vars/all": {"pdctl_min_prefill_instances": 0}},
     ["pdctl_min_prefill_instances is 0: it must be from 1 to the 4 planned prefill instances"]),
    ("min-prefill-above-plan",
     {"group_vars/all": {"pdctl_min_prefill_instances": 5}},
     ["pdctl_min_prefill_instances is 5: it must be from 1 to the 4 planned prefill instances"]),
    ("min-prefill-hosts-disagree",
     {"group_vars/all": {"pdctl_min_prefill_instances": 3}, "host_vars/" + P1: {"pdctl_min_prefill_instances": 2}},
     ["hosts disagree on pdctl_min_prefill_instances", "2 on " + P1, "3 on " + D0 + ", " + P0]),
]

# A top-level variable nothing reads (issue 37): Ansible takes the misspelling without a word and quarantine
# silently stays off; the planner names it and the nearest known name.
CASES.append(
    ("misspelled-variable",
     {"group_vars/all": {"pdctl_min_prefill_instance": 2}},
     ["unknown variable pdctl_min_prefill_instance on " + D0 + ", " + P0 + ", " + P1,
      "did you mean pdctl_min_prefill_instances?"]))
