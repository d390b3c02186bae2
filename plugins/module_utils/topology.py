# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Topology planner: turns inventory variables into the serving plan.

The plan is the single source of every GPU index and port the deployment uses: the
preflight role validates it, templates render units from it, `pdctl plan` prints it.
Pure standard library so it runs inside Ansible modules, filter plugins and the CLI.

Inventory contract (per host, after Ansible merged group_vars/host_vars):
  pdctl_gpu_count          int, GPUs on the host
  pdctl_instances          list of {pool, [name], [gpus], [api_port], [side_channel_port], [dp_rpc_port]};
                           unset, a host of one pool's group fills its GPUs with that pool's instances
                           (default_instances: the recipe's two prefill instances, one decode instance)
  pdctl_pools              {pool: {tensor_parallel_size, data_parallel_size}}
  pdctl_ports              {api_base, side_channel_base, dp_rpc_base, router, router_metrics,
                            frontdoor, frontdoor_metrics (front-door hosts only), and host-level ports
                            used during a deploy (kv_path_check, model_fanout, ...); on a prefill host
                            kv_path_check holds one port per KV path it checks, from there up}
  pdctl_kv_path_check      optional, its gpus (per_numa or all) sizes that range
  pdctl_monitoring         optional, the monitoring's listeners (roles/monitoring): node_exporter_port
                           (serving and router hosts), dcgm_exporter {enabled, port} (serving hosts),
                           port (Prometheus, on a router host)
  pdctl_model_path         served model directory
  pdctl_versions.vllm      vLLM release the host runs
  pdctl_advertise_address  routable address (defaults to ansible_host, then the host name)
  pdctl_hw_profile         expected hardware, overrides of the HGX B300 default (docs/hardware-profile.md):
                           each instance's KV NICs and CPUs follow its GPUs (place_on_hardware)
  pdctl_min_prefill_instances  optional, 1..planned prefill instances: a prefill host that fails its
                           host-stack checks is quarantined (quarantine()) while at least this many remain
  pdctl_cell               optional, the host's cell (docs/cells.md): normally set once in group_vars/<cell>/,
                           the cell's own inventory group, and named like it (a simple identifier). A cell's
                           routers pair only its own prefill and decode instances; a serving or router host
                           that sets none is in the one DEFAULT_CELL. Front-door hosts serve the whole fleet.
A host may also carry "names" (all its variable names): a `pdctl_*` name that no role, playbook or plugin
reads is refused with the nearest known one (module_utils/varnames.py).
Hosts in the `router` group (one or more) run the P/D router on pdctl_ports.router / router_metrics.
Hosts in the `frontdoor` group (default: the router hosts) run the front door (HAProxy) on
pdctl_ports.frontdoor / frontdoor_metrics and balance across every router. With more than one, clients
use one address that moves between them (keepalived, roles/frontdoor_vip):
  pdctl_frontdoor_vip      {address, [prefix], virtual_router_id, [interface]}: required with more than
                           one front-door host; an IP literal no host of the inventory has
"""
from __future__ import annotations

import ipaddress
import json
import re

from ansible_collections.pdctl.vllm_pd.plugins.module_utils.hwprofile import (
    ProfileError, placement, resolve as resolve_profile)
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import varnames
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.admission import capacity

KNOWN_POOLS = ("prefill", "decode")
POOL_KEYS = ("tensor_parallel_size", "data_parallel_size")
INSTANCE_KEYS = ("pool", "name", "gpus", "api_port", "side_channel_port", "dp_rpc_port")
PLANNED_PORT_KEYS = ("api_base", "side_channel_base", "dp_rpc_base", "router", "router_metrics",
                     "frontdoor", "frontdoor_metrics", "router_standby", "router_standby_metrics",
                     "router_aggregated", "router_aggregated_metrics")
# Every host needs these; front-door hosts also need FRONTDOOR_PORT_KEYS. Router hosts may name
# STANDBY_PORT_KEYS: the standby router a rolling upgrade runs while the router's membership changes.
HOST_PORT_KEYS = PLANNED_PORT_KEYS[:5]
FRONTDOOR_PORT_KEYS = ("frontdoor", "frontdoor_metrics")
STANDBY_PORT_KEYS = ("router_standby", "router_standby_metrics")
# Router hosts may name AGGREGATED_PORT_KEYS: a second router in regular (non-P/D) mode over the prefill
# instances, the front door's route while no decode instance can serve (docs/decode-loss.md).
AGGREGATED_PORT_KEYS = ("router_aggregated", "router_aggregated_metrics")
# The inventory variables the planner reads (the CLI and the filter pass exactly these).
PLAN_VARS = ("pdctl_gpu_count", "pdctl_instances", "pdctl_pools", "pdctl_ports", "pdctl_model_path",
             "pdctl_versions", "pdctl_advertise_address", "pdctl_extra_groups", "ansible_host", "pdctl_hw_profile",
             "pdctl_min_prefill_instances", "pdctl_frontdoor_vip", "pdctl_monitoring", "pdctl_kv_path_check",
             "pdctl_cell")
ROUTER_GROUP = "router"
FRONTDOOR_GROUP = "frontdoor"
# The router listens here when the front door is on its own host and nowhere else.
LOOPBACK = "127.0.0.1"
# Groups the planner gives a meaning to; `serving` is the parent of the pools. A host in any other
# group is refused unless the inventory names that group in pdctl_extra_groups (site groupings).
KNOWN_GROUPS = KNOWN_POOLS + (ROUTER_GROUP, FRONTDOOR_GROUP, "serving", "ungrouped")
# A cell (docs/cells.md) is an inventory group that sets this one variable; a group named like a cell is
# known. Serving and router hosts without it are in DEFAULT_CELL: an inventory without cells is one cell.
CELL_VAR = "pdctl_cell"
DEFAULT_CELL = "default"
# A cell's name is its group's name too, so what Ansible takes as a group name without rewriting it.
CELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class PlanError(Exception):
    """Raised with every validation problem found, so an operator fixes them in one pass."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def _as_int(value, what, problems):
    if isinstance(value, bool):
        problems.append("%s must be an integer, found %r" % (what, value))
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        problems.append("%s must be an integer, found %r" % (what, value))
        return None


def _gpu_list(value, what, problems):
    """Accept [0,1,2,3], "0,1,2,3" or "0-3"."""
    if isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = []
        for part in str(value).split(","):
            part = part.strip()
            if "-" in part:
                lo, dummy, hi = part.partition("-")
                lo_i, hi_i = _as_int(lo, what, problems), _as_int(hi, what, problems)
                if lo_i is None or hi_i is None:
                    return None
                items.extend(range(lo_i, hi_i + 1))
            elif part:
                items.append(part)
    gpus = [_as_int(item, what, problems) for item in items]
    if any(g is None for g in gpus):
        return None
    return gpus


def host_address(name, hostvars):
    return str(hostvars.get("pdctl_advertise_address") or hostvars.get("ansible_host") or name)


def _pool_settings(host, hostvars, pool, problems):
    pools = hostvars.get("pdctl_pools") or {}
    spec = pools.get(pool)
    if not isinstance(spec, dict):
        problems.append("%s: pool %r has no entry in pdctl_pools (known: %s)"
                        % (host, pool, ", ".join(sorted(pools)) or "none"))
        return None
    unknown = sorted(set(spec) - set(POOL_KEYS))
    if unknown:
        # A misspelt key would otherwise leave the size at its default of 1 without a word.
        problems.append("%s: pdctl_pools.%s has unknown keys %s (known: %s)"
                        % (host, pool, ", ".join(unknown), ", ".join(POOL_KEYS)))
        return None
    tp = _as_int(spec.get("tensor_parallel_size", 1), "%s: pdctl_pools.%s.tensor_parallel_size" % (host, pool), problems)
    dp = _as_int(spec.get("data_parallel_size", 1), "%s: pdctl_pools.%s.data_parallel_size" % (host, pool), problems)
    if tp is None or dp is None:
        return None
    if tp < 1 or dp < 1:
        problems.append("%s: pool %s needs tensor_parallel_size and data_parallel_size >= 1, found TP%d DP%d"
                        % (host, pool, tp, dp))
        return None
    return tp, dp


def _port_table(hostvars, host, problems, keys=HOST_PORT_KEYS):
    ports = hostvars.get("pdctl_ports") or {}
    out = {}
    for key in keys:
        if key not in ports:
            problems.append("%s: pdctl_ports.%s is not set" % (host, key))
            continue
        out[key] = _as_int(ports[key], "%s: pdctl_ports.%s" % (host, key), problems)
    return out


def _extra_port_claims(hostvars, host, problems):
    """Any other pdctl_ports entry is a host-level port used during a deploy (checks, fan-out)."""
    ports = hostvars.get("pdctl_ports") or {}
    claims = []
    for key in sorted(set(ports) - set(PLANNED_PORT_KEYS)):
        value = _as_int(ports[key], "%s: pdctl_ports.%s" % (host, key), problems)
        if value is not None:
            claims.append((value, value, "%s port" % key))
    return claims


def _monitoring_claims(hostvars, host, groups, problems):
    """The monitoring's listeners on this host (pdctl_monitoring, roles/monitoring and site.yml's monitoring
    play): node exporter on every serving and router host, the DCGM exporter on the serving hosts when
    enabled, Prometheus on the monitoring host (a router host; every router host claims its port)."""
    settings = hostvars.get("pdctl_monitoring")
    if settings is None:
        return []
    if not isinstance(settings, dict):
        problems.append("%s: pdctl_monitoring must be a mapping, found %s" % (host, type(settings).__name__))
        return []
    serving = bool(groups & set(KNOWN_POOLS))
    router = ROUTER_GROUP in groups
    wanted = []
    if (serving or router) and settings.get("node_exporter_port") is not None:
        wanted.append(("node_exporter_port", settings["node_exporter_port"], "node exporter port"))
    dcgm = settings.get("dcgm_exporter") or {}
    if serving and isinstance(dcgm, dict) and _truthy(dcgm.get("enabled")) and dcgm.get("port") is not None:
        wanted.append(("dcgm_exporter.port", dcgm["port"], "DCGM exporter port"))
    if router and settings.get("port") is not None:
        wanted.append(("port", settings["port"], "Prometheus port"))
    claims = []
    for key, raw, label in wanted:
        value = _as_int(raw, "%s: pdctl_monitoring.%s" % (host, key), problems)
        if value is not None:
            claims.append((value, value, "%s (pdctl_monitoring.%s)" % (label, key)))
    return claims


def _truthy(value):
    return value is True or str(value).strip().lower() in ("true", "yes", "on", "1")


def default_instances(host, hostvars, groups, problems):
    """The instances of a host without pdctl_instances: a host in one pool's group fills its GPUs with that
    pool's instances, pdctl_gpu_count // (tensor_parallel_size x data_parallel_size) of them (at least one, so
    that a pool bigger than the host is reported as such); a host in no pool's group runs none. A host in
    both pools' groups must say which it runs."""
    pools = [pool for pool in KNOWN_POOLS if pool in groups]
    if len(pools) > 1:
        problems.append("%s: in the %s groups without pdctl_instances: set it (which instances the host runs)"
                        % (host, " and ".join(pools)))
        return []
    if not pools:
        return []
    ignored = []  # the pool's and the GPU count's own problems are reported where the instances are placed
    settings = _pool_settings(host, hostvars, pools[0], ignored)
    gpu_count = _as_int(hostvars.get("pdctl_gpu_count", 0), "pdctl_gpu_count", ignored)
    if settings is None or gpu_count is None:
        return [{"pool": pools[0]}]
    per = settings[0] * settings[1]
    if gpu_count > per and gpu_count % per:
        # A GPU count that is wrong (or a host that lost GPUs) must not silently drop an instance.
        idle = ",".join(str(g) for g in range(gpu_count - gpu_count % per, gpu_count))
        problems.append("%s: pdctl_gpu_count %d is not a multiple of the %s pool's TP%d x DP%d: GPUs %s would sit "
                        "idle (set pdctl_instances)" % (host, gpu_count, pools[0], settings[0], settings[1], idle))
    return [{"pool": pools[0]}] * max(1, gpu_count // per)


def _plan_host(host, hostvars, groups, counters, problems, frontdoor=False, claims_out=None):
    """Place the host's instances on its GPUs and ports; return instance dicts.

    frontdoor: the host runs the front door, so its ports join the host's clash check."""
    raw = hostvars.get("pdctl_instances")
    if raw is None:
        raw = default_instances(host, hostvars, groups, problems)
    if not isinstance(raw, list):
        problems.append("%s: pdctl_instances must be a list, found %s" % (host, type(raw).__name__))
        return []
    gpu_count = _as_int(hostvars.get("pdctl_gpu_count", 0), "%s: pdctl_gpu_count" % host, problems)
    ports = _port_table(hostvars, host, problems)
    if gpu_count is None or None in ports.values() or len(ports) < 5:
        return []
    address = host_address(host, hostvars)
    model = hostvars.get("pdctl_model_path")
    vllm_version = (hostvars.get("pdctl_versions") or {}).get("vllm")
    next_gpu = 0
    next_side = ports["side_channel_base"]
    instances = []
    for slot, entry in enumerate(raw):
        where = "%s instance #%d" % (host, slot)
        if not isinstance(entry, dict):
            problems.append("%s: must be a mapping with a 'pool' key, found %r" % (where, entry))
            continue
        unknown = set(entry) - set(INSTANCE_KEYS)
        if unknown:
            problems.append("%s: unknown keys %s (known: %s)"
                            % (where, ", ".join(sorted(unknown)), ", ".join(INSTANCE_KEYS)))
            continue
        pool = entry.get("pool")
        if pool not in KNOWN_POOLS:
            problems.append("%s: unknown pool %r (known pools: %s)" % (where, pool, ", ".join(KNOWN_POOLS)))
            continue
        if pool not in groups:
            problems.append("%s: a %s instance on a host that is not in the %s group" % (where, pool, pool))
            continue
        settings = _pool_settings(host, hostvars, pool, problems)
        if settings is None:
            continue
        tp, dp = settings
        name = str(entry.get("name") or "%s-%d" % (pool, counters[pool]))
        counters[pool] += 1
        where = "%s %s" % (host, name)
        if "gpus" in entry:
            gpus = _gpu_list(entry["gpus"], "%s: gpus" % where, problems)
            if gpus is None:
                continue
        else:
            gpus = list(range(next_gpu, next_gpu + tp * dp))
        next_gpu = max(gpus, default=next_gpu - 1) + 1
        if len(gpus) != tp * dp:
            problems.append("%s: %d GPUs (%s) but TP%d x DP%d needs %d"
                            % (where, len(gpus), _mask(gpus), tp, dp, tp * dp))
        beyond = [g for g in gpus if g < 0 or g >= gpu_count]
        if beyond:
            problems.append("%s: GPUs %s are beyond the host's %d GPUs (0-%d)"
                            % (where, _mask(beyond), gpu_count, gpu_count - 1))
        side = _as_int(entry.get("side_channel_port", next_side), "%s: side_channel_port" % where, problems)
        api = _as_int(entry.get("api_port", ports["api_base"] + slot), "%s: api_port" % where, problems)
        rpc = _as_int(entry.get("dp_rpc_port", ports["dp_rpc_base"] + slot), "%s: dp_rpc_port" % where, problems)
        if None in (side, api, rpc):
            continue
        next_side = side + dp
        instances.append({
            "name": name,
            "host": host,
            "pool": pool,
            "address": address,
            "gpus": gpus,
            "cuda_visible_devices": ",".join(str(g) for g in gpus),
            "tensor_parallel_size": tp,
            "data_parallel_size": dp,
            "api_port": api,
            "url": "http://%s:%d" % (address, api),
            "side_channel_host": address,
            "side_channel_port": side,
            "side_channel_ports": [side, side + dp - 1],
            "dp_rpc_port": rpc,
            "model_path": model,
            "vllm_version": vllm_version,
            "unit": "pdctl-vllm-%s.service" % name,
        })
    service_claims = []
    if ROUTER_GROUP in groups:
        service_claims += [(ports["router"], "router port"), (ports["router_metrics"], "router metrics port")]
        standby = _standby_ports(hostvars, host, problems)
        service_claims += [(port, "%s port" % key.replace("_", " ")) for key, port in standby.items() if port]
        aggregated = _standby_ports(hostvars, host, problems, AGGREGATED_PORT_KEYS)
        service_claims += [(port, "%s port" % key.replace("_", " ")) for key, port in aggregated.items() if port]
    if frontdoor:
        fd = _port_table(hostvars, host, [], FRONTDOOR_PORT_KEYS)  # _plan_frontdoor reports its problems
        if None not in fd.values() and len(fd) == len(FRONTDOOR_PORT_KEYS):
            service_claims += [(fd["frontdoor"], "front door port"), (fd["frontdoor_metrics"], "front door metrics port")]
    extra = ([(p, p, who) for p, who in service_claims] + _extra_port_claims(hostvars, host, problems) +
             _monitoring_claims(hostvars, host, groups, problems))
    if "prefill" in groups:
        # A prefill host's KV-path check listeners span a range known once every instance is placed on
        # its hardware (_check_kv_check_ports); its first port alone is not checked here.
        extra = [c for c in extra if c[2] != KV_CHECK_PORT_LABEL]
    _check_host_clashes(host, instances, extra, problems)
    if claims_out is not None:
        claims_out[host] = _port_claims(instances, extra)
    return instances


def place_on_hardware(instances, hosts, problems):
    """Give each instance the KV NICs nearest its GPUs and its GPUs' CPUs, from the host's hardware
    profile (pdctl_hw_profile over the HGX B300 default). Adds to each instance:
      nics             RDMA devices on its GPUs' PCIe switches (never an NVSwitch management port)
      ucx_net_devices  UCX_NET_DEVICES for them ("mlx5_0:1,..."; "" when the profile lists no NICs)
      numa_nodes       its GPUs' NUMA nodes
      cpu_affinity     systemd CPUAffinity= for its GPUs' sockets ("" when the profile lists none)
      gpu_layout       per GPU, in slot order: {gpu, numa, nics} (the KV NIC(s) nearest that GPU)
    """
    profiles = {}
    for inst in instances:
        host = inst["host"]
        if host not in profiles:
            try:
                profiles[host] = resolve_profile((hosts[host].get("vars") or {}).get("pdctl_hw_profile") or {})
            except ProfileError as exc:
                profiles[host] = None
                problems.append("%s: pdctl_hw_profile: %s" % (host, exc))
        profile = profiles[host]
        if profile is None:
            continue
        try:
            place = placement(profile, inst["gpus"])
        except ProfileError as exc:
            problems.append("%s %s: %s" % (host, inst["name"], exc))
            continue
        inst["nics"] = place["nics"]
        inst["ucx_net_devices"] = ",".join("%s:1" % nic for nic in place["nics"])
        inst["numa_nodes"] = place["numa_nodes"]
        inst["cpu_affinity"] = place["cpu_affinity"]
        layout = []
        for gpu in inst["gpus"]:
            one = placement(profile, [gpu])
            layout.append({"gpu": gpu, "numa": (one["numa_nodes"] or [None])[0], "nics": one["nics"]})
        inst["gpu_layout"] = layout


KV_CHECK_GPUS = ("per_numa", "all")


def kv_check_paths(plan, base_port, gpus="per_numa"):
    """The KV paths that serve, as the KV-path check proves them: for every prefill instance, one GPU on
    each of its sockets (gpus=per_numa) or every GPU (all), read by every decode instance of its cell (decode
    pulls from prefill; KV never crosses cells) from a decode GPU on the same socket number where it has one.
    Each path:
      name             "<host> <instance> GPU <n> (NIC <nics>) -> <decode host> <decode instance> GPU <m>"
      prefill_host, prefill_instance, prefill_address, gpu, numa, nics, ucx_net_devices
      decode_host, decode_instance, decode_gpu, decode_ucx_net_devices
      port             the listener's control port on the prefill host (base_port + n-th path there)
    """
    if gpus not in KV_CHECK_GPUS:
        raise ValueError("KV check GPU choice %r, expected one of %s" % (gpus, ", ".join(KV_CHECK_GPUS)))
    instances = plan["instances"]
    decodes = [i for i in instances if i["pool"] == "decode"]
    per_host = {}
    paths = []
    for inst in (i for i in instances if i["pool"] == "prefill"):
        layout = inst.get("gpu_layout") or [{"gpu": g, "numa": None, "nics": []} for g in inst["gpus"]]
        chosen, seen = [], set()
        for entry in layout:
            if gpus == "all" or entry["numa"] not in seen:
                chosen.append(entry)
                seen.add(entry["numa"])
        for entry in chosen:
            # An instance without "cell" (a plan from before cells) is in the one cell there was.
            for dec in (d for d in decodes if d.get("cell") == inst.get("cell")):
                dlayout = dec.get("gpu_layout") or [{"gpu": g, "numa": None} for g in dec["gpus"]]
                dgpu = next((d["gpu"] for d in dlayout if d["numa"] == entry["numa"]), dec["gpus"][0])
                slot = per_host.get(inst["host"], 0)
                per_host[inst["host"]] = slot + 1
                nics = ",".join(entry["nics"]) or "none planned"
                paths.append({
                    "name": "%s %s GPU %d (NIC %s) -> %s %s GPU %d" % (
                        inst["host"], inst["name"], entry["gpu"], nics, dec["host"], dec["name"], dgpu),
                    "prefill_host": inst["host"],
                    "prefill_instance": inst["name"],
                    "prefill_address": inst["address"],
                    "gpu": entry["gpu"],
                    "numa": entry["numa"],
                    "nics": entry["nics"],
                    "ucx_net_devices": inst.get("ucx_net_devices", ""),
                    "decode_host": dec["host"],
                    "decode_instance": dec["name"],
                    "decode_gpu": dgpu,
                    "decode_ucx_net_devices": dec.get("ucx_net_devices", ""),
                    "port": int(base_port) + slot,
                })
    return paths


def _mask(gpus):
    return ",".join(str(g) for g in gpus)


def _check_host_clashes(host, instances, extra_claims, problems):
    # GPU overlap between instances on one host.
    owner = {}
    for inst in instances:
        for gpu in inst["gpus"]:
            if gpu in owner:
                problems.append("%s: GPU %d is in both %s and %s" % (host, gpu, owner[gpu], inst["name"]))
            owner.setdefault(gpu, inst["name"])
    claims = _port_claims(instances, extra_claims)
    for i, claim in enumerate(claims):
        _check_claim(host, claim, claims[i + 1:], problems)


def _port_claims(instances, extra_claims):
    """Every listening port on the host, with who holds it: (first, last, who)."""
    claims = []
    for inst in instances:
        claims.append((inst["api_port"], inst["api_port"], "%s API port" % inst["name"]))
        lo, hi = inst["side_channel_ports"]
        claims.append((lo, hi, "%s NIXL side-channel range" % inst["name"]))
        claims.append((inst["dp_rpc_port"], inst["dp_rpc_port"], "%s DP RPC port" % inst["name"]))
    return claims + list(extra_claims)


def _check_claim(host, claim, others, problems):
    lo_a, hi_a, who_a = claim
    if not 1 <= lo_a <= hi_a <= 65535:
        problems.append("%s: %s %s is outside 1-65535" % (host, who_a, _span(lo_a, hi_a)))
    for lo_b, hi_b, who_b in others:
        if lo_a <= hi_b and lo_b <= hi_a:
            problems.append("%s: port clash: %s %s overlaps %s %s"
                            % (host, who_a, _span(lo_a, hi_a), who_b, _span(lo_b, hi_b)))


KV_CHECK_PORT_LABEL = "kv_path_check port"


def _check_kv_check_ports(hosts, instances, claims, problems):
    """The KV-path check (playbooks/verify_kv_path.yml) opens one listener per checked path on each prefill
    host, from pdctl_ports.kv_path_check up (kv_check_paths gives path n on a host base + n): that whole
    range must clash with no other port of the host."""
    paths = {}  # per GPU choice, computed once for all hosts
    for host in sorted(claims, key=_natural_key):
        hostvars = hosts[host].get("vars") or {}
        if "prefill" not in (hosts[host].get("groups") or []):
            continue
        base = _as_int((hostvars.get("pdctl_ports") or {}).get("kv_path_check"), "", [])
        if base is None:
            continue
        check = hostvars.get("pdctl_kv_path_check") or {}
        gpus = check.get("gpus", "per_numa") if isinstance(check, dict) else "per_numa"
        if gpus not in KV_CHECK_GPUS:
            problems.append("%s: pdctl_kv_path_check.gpus must be one of %s, found %r"
                            % (host, ", ".join(KV_CHECK_GPUS), gpus))
            continue
        if gpus not in paths:
            paths[gpus] = kv_check_paths({"instances": instances}, 0, gpus)
        count = sum(1 for p in paths[gpus] if p["prefill_host"] == host)
        last = base + max(count, 1) - 1
        who = "%s range (%d KV-path check listener%s)" % (KV_CHECK_PORT_LABEL, count, "" if count == 1 else "s") \
            if count > 1 else KV_CHECK_PORT_LABEL
        _check_claim(host, (base, last, who), claims[host], problems)


def _span(lo, hi):
    return str(lo) if lo == hi else "%d-%d" % (lo, hi)


def _check_groups(host, groups, hostvars, problems, cells=(), cell=None):
    """Refuse the shapes Ansible merges without a word: two pools on one host, unknown groups, a host in the
    group of a cell that is not its own (in two cells' groups, Ansible keeps one pdctl_cell).

    cells: every cell name of the inventory (their groups are known); cell: this host's."""
    pools = sorted(groups & set(KNOWN_POOLS))
    if len(pools) > 1:
        problems.append("%s is in both the %s groups: a host serves one pool (Ansible would silently "
                        "merge both groups' variables and keep one)" % (host, " and ".join(pools)))
        return False
    others = sorted(groups & set(cells) - {cell}, key=_natural_key)
    if others:
        problems.append("%s is in the group of cell %s but its %s is %s: a host is in one cell (in two cells' "
                        "groups Ansible keeps one %s without a word)" % (host, ", ".join(others), CELL_VAR, cell,
                                                                         CELL_VAR))
        return False
    extra = hostvars.get("pdctl_extra_groups") or []
    if not isinstance(extra, list):
        problems.append("%s: pdctl_extra_groups must be a list of group names, found %r" % (host, extra))
        extra = []
    unknown = sorted(groups - set(KNOWN_GROUPS) - set(cells) - {str(g) for g in extra})
    if unknown:
        problems.append("%s is in group%s %s, which the planner does not know (known: %s; list site "
                        "groups in pdctl_extra_groups; a cell's group sets %s to its own name)"
                        % (host, "s" if len(unknown) > 1 else "", ", ".join(unknown), ", ".join(KNOWN_GROUPS[:4]),
                           CELL_VAR))
        return False
    if not groups & (set(KNOWN_POOLS) | {ROUTER_GROUP, FRONTDOOR_GROUP}):
        problems.append("%s is in none of the prefill, decode, router and frontdoor groups: it would serve nothing"
                        % host)
        return False
    return True


def _host_cells(hosts, problems):
    """{host: its cell}: pdctl_cell, DEFAULT_CELL where unset. A name that is no simple identifier is reported
    once with the hosts that carry it, and kept, so that nothing else fails because of it."""
    cells, bad = {}, {}
    for host in sorted(hosts, key=_natural_key):
        value = (hosts[host].get("vars") or {}).get(CELL_VAR)
        if value is None:
            cells[host] = DEFAULT_CELL
            continue
        if not isinstance(value, str) or not CELL_NAME.fullmatch(value):
            bad.setdefault(repr(value), []).append(host)
        cells[host] = str(value)
    for value, where in bad.items():
        problems.append("%s %s on %s is not a simple identifier (letters, digits and _, not starting with a digit): "
                        "a cell is named like its inventory group" % (CELL_VAR, value, ", ".join(where)))
    return cells


def _check_cells(names, instances, cell_of, routers, by_pool, problems):
    """Every cell serves on its own: a prefill and a decode instance, a router, prefill TP <= decode TP (KV
    moves only inside a cell). What the whole fleet lacks is reported once, by build_plan, not per cell.

    cell_of: {host: cell} of the serving and router hosts; routers: the router hosts."""
    for name in names:
        mine = [i for i in instances if i["cell"] == name]
        cell_routers = [h for h in routers if cell_of.get(h) == name]
        if not mine:
            # Its hosts are router hosts only (a serving host that places nothing is reported where it failed).
            if cell_routers and instances:
                problems.append("cell %s: router host%s %s but no serving instance: a router pairs only its own "
                                "cell's instances (give %s the %s of a serving cell, or take %s out of the %s group)"
                                % (name, "s" if len(cell_routers) > 1 else "", ", ".join(cell_routers),
                                   "them" if len(cell_routers) > 1 else "it", CELL_VAR,
                                   "them" if len(cell_routers) > 1 else "it", ROUTER_GROUP))
            continue
        pools = {pool: [i for i in mine if i["pool"] == pool] for pool in KNOWN_POOLS}
        for pool in KNOWN_POOLS:
            if not pools[pool] and by_pool[pool]:
                problems.append("cell %s: no %s instance: its routers pair prefill and decode inside the cell only "
                                "(hosts %s; put a %s host in the cell's group)"
                                % (name, pool, ", ".join(sorted({i["host"] for i in mine}, key=_natural_key)), pool))
        if not cell_routers and routers:
            problems.append("cell %s: no router host: nothing would send its instances a request (put one of %s "
                            "in the %s group)" % (name, ", ".join(sorted({i["host"] for i in mine}, key=_natural_key)),
                                                  ROUTER_GROUP))
        if pools["prefill"] and pools["decode"]:
            max_p = max(pools["prefill"], key=lambda i: i["tensor_parallel_size"])
            min_d = min(pools["decode"], key=lambda i: i["tensor_parallel_size"])
            if max_p["tensor_parallel_size"] > min_d["tensor_parallel_size"]:
                problems.append("cell %s: %s %s: prefill TP%d is larger than decode %s %s TP%d (NIXL needs prefill "
                                "TP <= decode TP)" % (name, max_p["host"], max_p["name"], max_p["tensor_parallel_size"],
                                                      min_d["host"], min_d["name"], min_d["tensor_parallel_size"]))


def _plan_cells(names, members, cell_of, instances, routers):
    """plan["cells"]: per cell, in natural order, its hosts, routers, instances and capacity (admission's
    capacity(), the one place capacity is counted). As planned: a quarantine leaves these as they are."""
    cells = []
    for name in names:
        mine = [i for i in instances if i["cell"] == name]
        planned = capacity({"instances": mine})
        cells.append({
            "name": name,
            "hosts": [h for h in members if cell_of[h] == name],
            "routers": [h for h in routers if cell_of[h] == name],
            "prefill": [i["name"] for i in mine if i["pool"] == "prefill"],
            "decode": [i["name"] for i in mine if i["pool"] == "decode"],
            "prefill_instances": planned["prefill_total"],
            "decode_gpus": planned["decode_gpus_total"],
        })
    return cells


def cell_view(plan, name):
    """The plan as one cell sees it: that cell's instances and routers ("router": its first), the fleet's front
    door, every other key as the plan has it. Plan-shaped, so the decisions made for a one-cell deployment
    (rollouts, maintenance, admission) run on it unchanged. Of a one-cell plan it is the plan itself."""
    cell = next((c for c in plan.get("cells") or () if c["name"] == name), None)
    if cell is None:
        raise ValueError("no cell %r in the plan (cells: %s)"
                         % (name, ", ".join(c["name"] for c in plan.get("cells") or ()) or "none"))
    frontdoor = (plan.get("frontdoor") or {}).get("hosts") or []
    view = dict(plan)
    view["instances"] = [i for i in plan["instances"] if i["cell"] == name]
    view["routers"] = [r for r in plan["routers"] if r["cell"] == name]
    view["router"] = view["routers"][0]
    view["cells"] = [cell]
    view["hosts"] = [h for h in plan["hosts"] if h in cell["hosts"] or h in frontdoor]
    # Another cell's quarantined instances are no part of this one's capacity (admission counts them as out).
    view["quarantined"] = [q for q in plan.get("quarantined") or () if q["host"] in cell["hosts"]]
    return view


def build_plan(hosts):
    """Compute and validate the serving plan.

    hosts: {name: {"groups": [group, ...], "vars": {merged host variables}}}
    Returns the plan dict; raises PlanError listing every problem found.
    """
    problems = []
    if not isinstance(hosts, dict) or not hosts:
        raise PlanError(["the inventory has no hosts"])

    def in_group(group):
        return sorted((h for h in hosts if group in (hosts[h].get("groups") or [])), key=_natural_key)

    routers = in_group(ROUTER_GROUP)
    # Without a frontdoor group the front door runs beside each router.
    frontdoors = in_group(FRONTDOOR_GROUP) or routers
    counters = {pool: 0 for pool in KNOWN_POOLS}
    instances = []
    seen_addresses = {}
    host_claims = {}
    cell_of = _host_cells(hosts, problems)
    for host in sorted(hosts, key=_natural_key):
        groups = set(hosts[host].get("groups") or [])
        hostvars = hosts[host].get("vars") or {}
        if not _check_groups(host, groups, hostvars, problems, set(cell_of.values()), cell_of[host]):
            continue
        address = host_address(host, hostvars)
        if address in seen_addresses:
            problems.append("duplicate host: %s and %s both point at %s" % (seen_addresses[address], host, address))
        seen_addresses.setdefault(address, host)
        placed = _plan_host(host, hostvars, groups, counters, problems, frontdoor=host in frontdoors,
                            claims_out=host_claims)
        for inst in placed:
            inst["cell"] = cell_of[host]
        instances.extend(placed)

    by_pool = {pool: [i for i in instances if i["pool"] == pool] for pool in KNOWN_POOLS}
    for pool in KNOWN_POOLS:
        if not by_pool[pool] and not any("%s instance" % pool in p for p in problems):
            problems.append("no %s instance: P/D needs at least one prefill and one decode instance "
                            "(check the %s group and its pdctl_instances)" % (pool, pool))
    # Serving and router hosts are in a cell; a front-door host serves the whole fleet.
    members = [h for h in sorted(hosts, key=_natural_key)
               if set(hosts[h].get("groups") or []) & set(KNOWN_POOLS + (ROUTER_GROUP,))]
    cell_names = sorted({cell_of[h] for h in members}, key=_natural_key)
    _check_cells(cell_names, instances, {h: cell_of[h] for h in members}, routers, by_pool, problems)
    if by_pool["prefill"] and by_pool["decode"]:
        for key, label in (("model_path", "model"), ("vllm_version", "vLLM version")):
            values = sorted({str(i[key]) for i in instances})
            if len(values) > 1:
                detail = ", ".join("%s %s=%s" % (i["host"], i["name"], i[key]) for i in instances)
                problems.append("prefill and decode must serve the same %s, found %s (%s)"
                                % (label, " vs ".join(values), detail))
            elif values == ["None"]:
                problems.append("no %s set (pdctl_%s)" % (label, "model_path" if key == "model_path" else "versions.vllm"))

    place_on_hardware(instances, hosts, problems)
    _check_kv_check_ports(hosts, instances, host_claims, problems)
    min_prefill = _min_prefill_instances(hosts, len(by_pool["prefill"]), problems)
    # Hosts given with all their variable names (the CLI, the plan filter): a pdctl_* name nothing reads.
    names = {h: hosts[h]["names"] for h in hosts if "names" in hosts[h]}
    if names:
        problems.extend(varnames.unknown_variables(names, varnames.known_variables()))

    if not routers:
        problems.append("the %s group must hold at least one host, found none" % ROUTER_GROUP)
    frontdoor = _plan_frontdoor(hosts, frontdoors, problems)
    if problems:
        raise PlanError(problems)

    # A router pairs its own cell's instances only: its upstreams are that cell's.
    router_list = []
    for host in routers:
        mine = [i for i in instances if i["cell"] == cell_of[host]]
        cell_pools = {pool: [i for i in mine if i["pool"] == pool] for pool in KNOWN_POOLS}
        router_list.append(dict(_plan_router(host, hosts[host].get("vars") or {}, frontdoors, cell_pools),
                                cell=cell_of[host]))
    return {
        "instances": instances,
        "router": router_list[0],
        "routers": router_list,
        "cells": _plan_cells(cell_names, members, cell_of, instances, routers),
        "frontdoor": frontdoor,
        "model_path": instances[0]["model_path"],
        "vllm_version": instances[0]["vllm_version"],
        "hosts": sorted({i["host"] for i in instances} | set(routers) | set(frontdoors), key=_natural_key),
        # Unset (None): any host that fails its checks fails the run. Set: see quarantine().
        "min_prefill_instances": min_prefill,
        "quarantined": [],
    }


MIN_PREFILL_VAR = "pdctl_min_prefill_instances"


def _min_prefill_instances(hosts, planned, problems):
    """pdctl_min_prefill_instances as an int in 1..planned, or None when no host sets it."""
    values = {}
    for host in sorted(hosts, key=_natural_key):
        hostvars = hosts[host].get("vars") or {}
        if hostvars.get(MIN_PREFILL_VAR) is not None:
            values.setdefault(repr(hostvars[MIN_PREFILL_VAR]), (hostvars[MIN_PREFILL_VAR], []))[1].append(host)
    if not values or not planned:  # no prefill instance at all is reported on its own
        return None
    if len(values) > 1:
        # One deployment, one floor: hosts that disagree would each judge the quarantine differently.
        problems.append("hosts disagree on %s: %s (set it once, in group_vars/all or with -e)" % (
            MIN_PREFILL_VAR, "; ".join("%s on %s" % (value, ", ".join(where)) for value, where in values.values())))
        return None
    raw = next(iter(values.values()))[0]
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw)  # -e pdctl_min_prefill_instances=2 arrives as a string
    if not isinstance(raw, int) or isinstance(raw, bool):
        problems.append("%s must be an integer from 1 to the %d planned prefill instances, found %r"
                        % (MIN_PREFILL_VAR, planned, raw))
        return None
    if not 1 <= raw <= planned:
        problems.append("%s is %d: it must be from 1 to the %d planned prefill instances (the rollout goes on "
                        "only while at least that many serve)" % (MIN_PREFILL_VAR, raw, planned))
        return None
    return raw


class QuarantineError(Exception):
    """A quarantine the plan does not allow; problems name each host and the check it failed."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def quarantine(plan, failures, groups):
    """The plan without the instances of prefill hosts that failed their host checks.

    failures: [{"host", "task", "msg"}], one per failed check (as the host-stack play records them).
    groups:   the inventory's groups, {group: [host, ...]} (Ansible's `groups`).
    Returns a copy of the plan whose instances and routers' prefill_urls leave those hosts out, with
    plan["quarantined"] = [{"host", "instances", "units", "failures": [{"task", "msg"}], "reason"}]. Raises
    QuarantineError, naming every failed host and its failure, when pdctl_min_prefill_instances is
    unset, a failed host is not a prefill-only host (decode, router and front-door hosts never are), or
    fewer than the minimum prefill instances would remain.
    """
    by_host = {}
    for failure in failures or []:
        by_host.setdefault(str(failure["host"]), []).append(
            {"task": str(failure.get("task") or "?"), "msg": _flat(failure.get("msg"))})
    if not by_host:
        return plan
    hosts = sorted(by_host, key=_natural_key)
    named = ["%s (%s)" % (host, "; ".join("%s: %s" % (f["task"], f["msg"]) for f in by_host[host]))
             for host in hosts]
    minimum = plan.get("min_prefill_instances")
    if minimum is None:
        raise QuarantineError(["%s is not set, so no host is quarantined: %s" % (MIN_PREFILL_VAR, h) for h in named])
    problems = []
    for host, line in zip(hosts, named):
        mine = {group for group, members in (groups or {}).items() if host in (members or [])}
        other = sorted(mine & {"decode", ROUTER_GROUP, FRONTDOOR_GROUP})
        if "prefill" not in mine or other:
            problems.append("%s cannot be quarantined: only a prefill host can (it is in %s)"
                            % (line, ", ".join(other) or "no prefill group"))
    prefill = [i for i in plan["instances"] if i["pool"] == "prefill"]
    remaining = [i for i in prefill if i["host"] not in by_host]
    if len(remaining) < minimum:
        problems.append("%d of %d prefill instances would remain, fewer than %s=%d; failed: %s"
                        % (len(remaining), len(prefill), MIN_PREFILL_VAR, minimum, "; ".join(named)))
    # The floor is the fleet's, but a cell's routers pair only its own instances: none left there, none served
    # (with one cell, the floor of at least 1 says so already).
    emptied = {i.get("cell") for i in prefill} - {i.get("cell") for i in remaining}
    for cell in sorted(emptied if len(plan.get("cells") or ()) > 1 else (), key=_natural_key):
        problems.append("cell %s would keep no prefill instance (its routers pair only its own); failed: %s"
                        % (cell, "; ".join(line for host, line in zip(hosts, named)
                                           if any(i["host"] == host and i.get("cell") == cell for i in prefill))))
    if problems:
        raise QuarantineError(problems)
    out = dict(plan)
    out["instances"] = [i for i in plan["instances"] if i["host"] not in by_host]
    gone = {i["url"] for i in plan["instances"] if i["host"] in by_host}
    out["routers"] = [dict(r, prefill_urls=[u for u in r["prefill_urls"] if u not in gone]) for r in plan["routers"]]
    out["router"] = out["routers"][0]
    out["quarantined"] = list(plan.get("quarantined") or []) + [
        {"host": host,
         "instances": [i["name"] for i in prefill if i["host"] == host],
         "units": [i["unit"] for i in prefill if i["host"] == host],
         "failures": by_host[host],
         "reason": "; ".join("%s: %s" % (f["task"], f["msg"]) for f in by_host[host])} for host in hosts]
    return out


def _flat(msg):
    """A check's message on one line (assert messages may be lists or folded text)."""
    if isinstance(msg, (list, tuple)):
        msg = " ".join(str(m) for m in msg)
    return " ".join(str(msg if msg is not None else "failed").split())


def _standby_ports(hostvars, host, problems, keys=STANDBY_PORT_KEYS):
    """An optional router's ports (the standby's, or with AGGREGATED_PORT_KEYS the aggregated router's):
    both or neither, {key: int or None}."""
    ports = hostvars.get("pdctl_ports") or {}
    given = [k for k in keys if k in ports]
    if given and len(given) < len(keys):
        problems.append("%s: pdctl_ports.%s needs pdctl_ports.%s too (the %s router's port and metrics port)"
                        % (host, given[0], (set(keys) - set(given)).pop(), keys[0].split("_", 1)[1]))
    return {k: _as_int(ports[k], "%s: pdctl_ports.%s" % (host, k), problems) if k in ports else None
            for k in keys}


def _plan_router(host, hostvars, frontdoors, by_pool):
    """One router: where it listens (bind) and the URL the front door reaches it on."""
    address = host_address(host, hostvars)
    ports = hostvars["pdctl_ports"]
    # Loopback only when the front door is on this host and nowhere else: then no other host
    # ever needs the router port.
    bind = LOOPBACK if frontdoors == [host] else address
    standby = _standby_ports(hostvars, host, [])  # _plan_host reports their problems
    aggregated = _standby_ports(hostvars, host, [], AGGREGATED_PORT_KEYS)
    return {
        "host": host,
        "address": address,
        "port": int(ports["router"]),
        "metrics_port": int(ports["router_metrics"]),
        "bind": bind,
        "url": "http://%s:%d" % (bind, int(ports["router"])),
        # The standby router (rolling upgrades): same bind, its own ports; None when not planned.
        "standby_port": standby["router_standby"],
        "standby_metrics_port": standby["router_standby_metrics"],
        "standby_url": "http://%s:%d" % (bind, standby["router_standby"]) if standby["router_standby"] else None,
        # The aggregated router (degraded mode: the prefill instances serve whole requests while no decode
        # can); same bind, its own ports, the same prefill_urls as workers; None when not planned.
        "aggregated_port": aggregated["router_aggregated"],
        "aggregated_metrics_port": aggregated["router_aggregated_metrics"],
        "aggregated_url": ("http://%s:%d" % (bind, aggregated["router_aggregated"])
                           if aggregated["router_aggregated"] else None),
        "prefill_urls": [i["url"] for i in by_pool["prefill"]],
        "decode_urls": [i["url"] for i in by_pool["decode"]],
    }


def _plan_frontdoor(hosts, frontdoors, problems):
    """The front door: its hosts, their addresses and the one port pair they all listen on."""
    if not frontdoors:
        return None
    found = {}
    for host in frontdoors:
        table = _port_table(hosts[host].get("vars") or {}, host, problems, FRONTDOOR_PORT_KEYS)
        for key in FRONTDOOR_PORT_KEYS:
            found.setdefault(key, {}).setdefault(table.get(key), []).append(host)
    ports = {}
    for key, values in found.items():
        if len(values) > 1:
            # Clients and the monitoring get one port; hosts that disagree would split them.
            problems.append("front-door hosts disagree on pdctl_ports.%s: %s" % (key, "; ".join(
                "%s on %s" % (value, ", ".join(where)) for value, where in sorted(values.items(), key=str))))
        ports[key] = next(iter(values))
    if None in ports.values():
        return None  # reported above
    addresses = [host_address(h, hosts[h].get("vars") or {}) for h in frontdoors]
    vip = _plan_vip(hosts, frontdoors, problems)
    if vip is False:
        return None  # reported
    return {
        "hosts": list(frontdoors),
        "addresses": addresses,
        "port": ports["frontdoor"],
        "metrics_port": ports["frontdoor_metrics"],
        # The one client address: the VIP when there is one (it moves to a live front-door host).
        "vip": vip,
        "url": "https://%s:%d" % (_url_host(vip["address"] if vip else addresses[0]), ports["frontdoor"]),
    }


VIP_VAR = "pdctl_frontdoor_vip"
VIP_KEYS = ("address", "prefix", "virtual_router_id", "interface")


def _url_host(address):
    return "[%s]" % address if ":" in str(address) else str(address)


def _plan_vip(hosts, frontdoors, problems):
    """The front door's virtual address (VRRP, keepalived on every front-door host): None when not set
    (allowed with one front-door host only), False when invalid (problems say why), else
    {address, prefix, virtual_router_id, interface}."""
    values = {}
    for host in frontdoors:
        value = (hosts[host].get("vars") or {}).get(VIP_VAR)
        values.setdefault(json.dumps(value, sort_keys=True, default=str), []).append(host)
    if len(values) > 1:
        problems.append("front-door hosts disagree on %s: %s" % (VIP_VAR, "; ".join(
            "%s on %s" % (value, ", ".join(where)) for value, where in sorted(values.items()))))
        return False
    value = (hosts[frontdoors[0]].get("vars") or {}).get(VIP_VAR)
    if not value:
        if len(frontdoors) > 1:
            problems.append("%d front-door hosts (%s) need %s: the one address clients use, which moves to a live "
                            "front-door host (docs/decode-loss.md)" % (len(frontdoors), ", ".join(frontdoors), VIP_VAR))
            return False
        return None
    if not isinstance(value, dict) or set(value) - set(VIP_KEYS) or "address" not in value:
        problems.append("%s must be {address, [prefix], virtual_router_id, [interface]}, found %r" % (VIP_VAR, value))
        return False
    try:
        address = ipaddress.ip_address(str(value["address"]))
    except ValueError:
        problems.append("%s.address %r is not an IP address" % (VIP_VAR, value["address"]))
        return False
    bad = len(problems)
    prefix = value.get("prefix", address.max_prefixlen)
    if not isinstance(prefix, int) or not 1 <= prefix <= address.max_prefixlen:
        problems.append("%s.prefix must be 1..%d, found %r" % (VIP_VAR, address.max_prefixlen, prefix))
    vrid = value.get("virtual_router_id")
    if not isinstance(vrid, int) or isinstance(vrid, bool) or not 1 <= vrid <= 255:
        problems.append("%s.virtual_router_id must be 1..255 (unique on the network segment), found %r"
                        % (VIP_VAR, vrid))
    # The VIP is nobody's own address: a host that has it would answer for it whoever holds it.
    for host in sorted(hosts, key=_natural_key):
        hv = hosts[host].get("vars") or {}
        own = {str(hv.get(k)) for k in ("ansible_host", "pdctl_advertise_address") if hv.get(k)}
        if str(address) in own or str(value["address"]) in own:
            problems.append("%s.address %s clashes with %s's own address" % (VIP_VAR, address, host))
    if len(problems) > bad:
        return False
    return {"address": str(address), "prefix": prefix, "virtual_router_id": vrid,
            "interface": value.get("interface")}


def _natural_key(name):
    out = []
    chunk = ""
    for ch in str(name):
        if ch.isdigit() != chunk[-1:].isdigit() and chunk:
            out.append(int(chunk) if chunk.isdigit() else chunk)
            chunk = ""
        chunk += ch
    if chunk:
        out.append(int(chunk) if chunk.isdigit() else chunk)
    return [(0, x) if isinstance(x, int) else (1, x) for x in out]


def instances_on(plan, host):
    return [i for i in plan["instances"] if i["host"] == host]


def format_table(plan):
    """Human-readable plan, one row per serving instance, then the front door, the routers and the cells.
    With several cells the table has a CELL column (with one, every row would say the same)."""
    several = len(plan.get("cells") or ()) > 1
    header = ("INSTANCE", "HOST", "POOL", "GPUS", "TPxDP", "API", "NIXL SIDE CHANNEL", "DP RPC", "NUMA", "KV NICS")
    rows = [("CELL",) + header if several else header]
    for i in plan["instances"]:
        lo, hi = i["side_channel_ports"]
        row = (i["name"], i["host"], i["pool"], i["cuda_visible_devices"],
               "%dx%d" % (i["tensor_parallel_size"], i["data_parallel_size"]),
               str(i["api_port"]), "%s:%s" % (i["side_channel_host"], _span(lo, hi)), str(i["dp_rpc_port"]),
               ",".join(str(n) for n in i.get("numa_nodes", [])) or "-", ",".join(i.get("nics", [])) or "-")
        rows.append((i["cell"],) + row if several else row)
    header = rows[0]
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[c]) for c, cell in enumerate(row)).rstrip() for row in rows]
    lines.append("")
    fd = plan.get("frontdoor")
    if fd:
        lines.append("front door: %s on %s (metrics :%d)" % (fd["url"], ", ".join(fd["hosts"]), fd["metrics_port"]))
        if fd.get("vip"):
            lines.append("  virtual address %s (VRRP id %d) moves between the front-door hosts"
                         % (fd["vip"]["address"], fd["vip"]["virtual_router_id"]))
    for r in plan.get("routers") or [plan["router"]]:
        where = " in %s" % r["cell"] if several else ""
        lines.append("router: %s on %s%s (metrics :%d)" % (r["url"], r["host"], where, r["metrics_port"]))
        if r.get("aggregated_url"):
            lines.append("aggregated router (no decode: prefill serves whole requests): %s on %s (metrics :%d)"
                         % (r["aggregated_url"], r["host"], r["aggregated_metrics_port"]))
    if not several:
        r = plan["router"]
        lines.append("  prefill upstreams: %s" % " ".join(r["prefill_urls"]))
        lines.append("  decode upstreams:  %s" % " ".join(r["decode_urls"]))
    if plan.get("cells"):
        lines.append("cells (a cell's routers pair only its own prefill and decode instances):")
        for c in plan["cells"]:
            lines.append("  %s: routers %s; %d prefill instance%s (%s), %d decode GPUs (%s); hosts %s" % (
                c["name"], ", ".join(c["routers"]), c["prefill_instances"], "" if c["prefill_instances"] == 1 else "s",
                ", ".join(c["prefill"]), c["decode_gpus"], ", ".join(c["decode"]), ", ".join(c["hosts"])))
    lines.append("model: %s   vLLM: %s" % (plan["model_path"], plan["vllm_version"]))
    if plan.get("min_prefill_instances"):
        lines.append("a prefill host that fails its checks is quarantined while >= %d prefill instances remain "
                     "(%s)" % (plan["min_prefill_instances"], MIN_PREFILL_VAR))
    for q in plan.get("quarantined") or []:
        lines.append("quarantined: %s (%s): %s" % (q["host"], ", ".join(q["instances"]), q["reason"]))
    return "\n".join(lines)


def to_json(plan):
    return json.dumps(plan, indent=2, sort_keys=True)
