# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Host firewall from the serving plan: per host, the inbound flows the plan needs and nothing else.

rules(plan, inputs) is the one place the firewall is decided; roles/firewall renders its result into
nftables (templates/nftables.conf.j2) and `pdctl render` shows it. Every port comes from the plan or
the inventory; inbound traffic not listed here is dropped. Pure standard library.

Each host gets a list of rule dicts, in order:
  name     short label (the nft rule comment)
  why      one line for the reader of the rendered file
  action   accept | drop
and what the rule matches, any of:
  ct_state     conntrack states, e.g. ["established", "related"]
  iif          input interface ("lo")
  proto        tcp | icmp | icmpv6 | vrrp (IP protocol 112, no ports)
  icmp_types   ICMP / ICMPv6 type names (proto icmp / icmpv6)
  ports        destination ports, each "N" or "N-M" (proto tcp)
  sources      source addresses or networks; a port rule is only emitted when it has at least one
  by_family    the sources split for nft: [["ip", [IPv4 ...]], ["ip6", [IPv6 ...]]], empty ones left out
"""
from __future__ import annotations

import ipaddress

from ansible_collections.pdctl.vllm_pd.plugins.module_utils.topology import kv_check_paths

# The kernel's default net.ipv4.ip_local_port_range: where UCX's TCP transport listens (port 0).
DEFAULT_EPHEMERAL_PORTS = "32768-60999"
ICMP_TYPES = ["echo-request", "destination-unreachable", "time-exceeded", "parameter-problem"]
# Neighbour discovery and path MTU discovery: IPv6 does not work without them.
ICMPV6_TYPES = ["echo-request", "destination-unreachable", "packet-too-big", "time-exceeded",
                "parameter-problem", "nd-router-solicit", "nd-router-advert", "nd-neighbor-solicit",
                "nd-neighbor-advert", "mld-listener-query"]


class FirewallError(ValueError):
    """Raised with every problem found in the inputs."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def _is_ip(value):
    try:
        ipaddress.ip_address(str(value))
        return True
    except ValueError:
        return False


def host_addresses(hostvars):
    """The addresses a host's traffic comes from, as the other hosts see it: pdctl_firewall_addresses
    when set, else its advertise address and ansible_host (IP literals only: nft needs no DNS)."""
    given = hostvars.get("pdctl_firewall_addresses")
    if given:
        return [str(a) for a in given]
    found = []
    for key in ("pdctl_advertise_address", "ansible_host"):
        value = hostvars.get(key)
        if value and _is_ip(value) and str(value) not in found:
            found.append(str(value))
    return found


def ucx_uses_tcp(ucx_environment):
    """Whether UCX may carry KV over TCP with this environment (UCX_TLS unset or 'all' means yes)."""
    tls = [t.strip() for t in str((ucx_environment or {}).get("UCX_TLS") or "all").split(",") if t.strip()]
    if tls and tls[0].startswith("^"):
        return "tcp" not in [t.lstrip("^") for t in tls]
    return "all" in tls or "tcp" in tls


def address_in_networks(address, networks):
    """True when address (an IP literal) lies in one of the networks."""
    try:
        ip = ipaddress.ip_address(str(address).strip())
    except ValueError:
        return False
    for net in networks or []:
        try:
            if ip in ipaddress.ip_network(str(net), strict=False):
                return True
        except ValueError:
            continue
    return False


def _span(lo, hi=None):
    hi = lo if hi is None else hi
    return str(lo) if int(lo) == int(hi) else "%d-%d" % (int(lo), int(hi))


def _networks(values, what, problems):
    out = []
    if not isinstance(values, (list, tuple)):
        problems.append("%s must be a list of networks (CIDR), found %r" % (what, values))
        return out
    for value in values:
        try:
            net = ipaddress.ip_network(str(value), strict=False)
        except ValueError:
            problems.append("%s: %r is not an address or network (CIDR)" % (what, value))
            continue
        if str(net) not in out:
            out.append(str(net))
    return out


def _routers(plan):
    """plan["routers"], or the single plan["router"] of an older plan (then reachable on its address)."""
    routers = plan.get("routers")
    if routers:
        return routers
    router = dict(plan["router"])
    router.setdefault("bind", router["address"])
    return [router]


def _frontdoor(plan, routers):
    frontdoor = plan.get("frontdoor")
    if frontdoor:
        return frontdoor
    return {"hosts": [r["host"] for r in routers], "port": None, "metrics_port": None}


def firewall_hosts(plan, monitoring_host=None):
    """Every host the firewall covers: serving, router and front-door hosts (and Prometheus')."""
    routers = _routers(plan)
    hosts = []
    for host in (list(plan.get("hosts") or []) + [i["host"] for i in plan["instances"]]
                 + [r["host"] for r in routers] + list(_frontdoor(plan, routers)["hosts"])
                 + ([monitoring_host] if monitoring_host else [])):
        if host not in hosts:
            hosts.append(host)
    return hosts


def _port_rule(name, why, ports, sources):
    sources = sorted(set(sources), key=_source_key)
    by_family = [[family, [s for s in sources if _source_key(s)[0] == version]] for family, version in
                 (("ip", 4), ("ip6", 6))]
    return {"name": name, "why": why, "action": "accept", "proto": "tcp", "ports": [str(p) for p in ports],
            "sources": sources, "by_family": [f for f in by_family if f[1]]}


def _source_key(source):
    net = ipaddress.ip_network(source, strict=False)
    return (net.version, net.network_address, net.prefixlen)


def rules(plan, inputs, only=None):
    """{host: [rule, ...]} for every host of the plan (see the module docstring for a rule), or for the hosts
    in `only`: a host's own render needs only its rules, and a fleet's whole set for each host is quadratic.

    inputs:
      addresses           {host: [address, ...]} where each host's traffic comes from (host_addresses)
      admin_networks      networks allowed SSH and the monitoring endpoints (the controller's, the operators');
                          never the instances' API ports (generation endpoints without a key)
      client_networks     networks allowed the front door's port
      ssh_port            22
      monitoring_host     the host Prometheus runs on (roles/monitoring: the first router host); must be a
                          router host of the plan, the only hosts that reach the instances' API ports
      prometheus_port     Prometheus' own port (from the admin networks only)
      node_exporter_port  node exporter on every host
      dcgm_exporter_port  DCGM exporter on the serving hosts; None when not run
      ucx_environment     pdctl_ucx_environment (decides whether KV may go over TCP)
      ephemeral_ports     "lo-hi": where UCX's TCP transport listens (the kernel's ip_local_port_range)
      kv_check_port       pdctl_ports.kv_path_check (None: no KV-path check listeners)
      kv_check_gpus       pdctl_kv_path_check.gpus (per_numa | all)
      model_fanout_port   pdctl_ports.model_fanout (None: no fan-out)
    """
    problems = []
    admin = _networks(inputs.get("admin_networks") or [], "admin networks (pdctl_firewall_admin_networks)", problems)
    if not admin:
        problems.append("no admin network (pdctl_firewall_admin_networks): SSH would be closed to everyone, "
                        "the controller included")
    clients = _networks(inputs.get("client_networks") or [], "client networks (pdctl_frontdoor_client_networks)",
                        problems)
    monitoring_host = inputs.get("monitoring_host")
    hosts = firewall_hosts(plan, monitoring_host)
    given = inputs.get("addresses") or {}
    addresses = {}
    for host in hosts:
        addresses[host] = []
        for value in given.get(host) or []:
            if _is_ip(value):
                addresses[host].append(str(ipaddress.ip_address(str(value))))
            else:
                problems.append("%s: address %r is not an IP address" % (host, value))
        if not addresses[host]:
            problems.append("%s: no IP address to allow its traffic from (set ansible_host or "
                            "pdctl_advertise_address to an IP, or pdctl_firewall_addresses)" % host)
    if problems:
        raise FirewallError(problems)

    def of(host_list):
        return [a for h in host_list for a in addresses[h]]

    instances = plan["instances"]
    # KV moves and routers send only inside a cell (topology: docs/cells.md). An instance or router without
    # "cell" (a plan from before cells) is in the one cell there was.
    cell_of = {i["host"]: i.get("cell") for i in instances}
    pool_hosts = {}  # {(pool, cell): {host, ...}}
    for inst in instances:
        pool_hosts.setdefault((inst["pool"], inst.get("cell")), set()).add(inst["host"])
    other_pool = {"prefill": "decode", "decode": "prefill"}
    serving_hosts = sorted({i["host"] for i in instances})

    def kv_peers(pool, host):
        """The hosts of its cell that move KV with a `pool` instance on `host`: the other pool's, and for a
        prefill instance every other prefill host too. While the decode restarts (a decode change, the decode
        host's maintenance) a temporary decode on one prefill instance's GPUs pulls KV from every other prefill
        instance of the cell; which one lends can change with a quarantine, so any prefill host may pull."""
        cell = cell_of[host]
        peers = set(pool_hosts.get((other_pool[pool], cell), ()))
        if pool == "prefill":
            peers |= pool_hosts.get(("prefill", cell), set()) - {host}
        return sorted(peers)
    routers = _routers(plan)
    router_hosts = [r["host"] for r in routers]
    if monitoring_host and monitoring_host not in router_hosts:
        raise FirewallError(["Prometheus' host %s is not a router host of the plan (%s): instance API ports, "
                             "which carry generation endpoints without a key, are open to the router hosts only, "
                             "so Prometheus must run on one to scrape the instances"
                             % (monitoring_host, ", ".join(router_hosts))])
    frontdoor = _frontdoor(plan, routers)
    monitors = (of([monitoring_host]) if monitoring_host else []) + admin
    kv_tcp = None
    if ucx_uses_tcp(inputs.get("ucx_environment")):
        kv_tcp = str(inputs.get("ephemeral_ports") or DEFAULT_EPHEMERAL_PORTS)
    kv_check = {}
    if inputs.get("kv_check_port") is not None:
        gpus = inputs.get("kv_check_gpus") or "per_numa"
        for path in kv_check_paths(plan, int(inputs["kv_check_port"]), gpus):
            kv_check.setdefault(path["prefill_host"], []).append(path["port"])

    out = {}
    for host in (h for h in hosts if only is None or h in only):
        own = addresses[host]
        ruleset = [
            {"name": "established", "why": "replies and related flows of connections already allowed",
             "action": "accept", "ct_state": ["established", "related"]},
            {"name": "invalid", "why": "packets conntrack cannot place", "action": "drop", "ct_state": ["invalid"]},
            {"name": "loopback", "why": "the host talking to itself (its own addresses arrive on lo too)",
             "action": "accept", "iif": "lo"},
            {"name": "icmp", "why": "reachability errors and ping", "action": "accept", "proto": "icmp",
             "icmp_types": list(ICMP_TYPES)},
            {"name": "icmpv6", "why": "neighbour discovery, path MTU and errors: IPv6 needs them",
             "action": "accept", "proto": "icmpv6", "icmp_types": list(ICMPV6_TYPES)},
            _port_rule("ssh", "SSH from the admin networks (the controller): asserted before every apply",
                       [inputs.get("ssh_port", 22)], admin),
        ]
        for inst in (i for i in instances if i["host"] == host):
            peers = kv_peers(inst["pool"], host)
            # Its cell's routers only: another cell's never send to it.
            callers = [r["host"] for r in routers if r.get("cell") == inst.get("cell")]
            kinds = ["router"]
            if monitoring_host and monitoring_host not in callers:
                # Prometheus scrapes /metrics of every cell's instances from its router host (checked above).
                callers.append(monitoring_host)
                kinds.append("Prometheus'")
            # The front doors ask a decode instance's /health themselves (haproxy.cfg.j2, be_check_*).
            checkers = [h for h in frontdoor["hosts"] if h not in callers and inst["pool"] == "decode"]
            if checkers:
                callers += checkers
                kinds.append("front-door")
            ruleset.append(_port_rule(
                # Not the admin networks, not Prometheus from elsewhere: vLLM's key guards only /v1, /v2,
                # /inference and /cohere; POST /invocations and /scale_elastic_ep generate without one.
                "%s api" % inst["name"], "%s's API (generation endpoints without a key): the %s hosts (%s) "
                "and the instance's own host only" % (inst["name"], ", ".join(kinds[:-1]) + " and " + kinds[-1]
                                                      if len(kinds) > 1 else kinds[0], ", ".join(callers)),
                [inst["api_port"]], of(callers) + own))
            ruleset.append(_port_rule(
                "%s nixl side channel" % inst["name"], "%s's NIXL side channel from the hosts it moves KV with (%s)"
                % (inst["name"], ", ".join(peers)), [_span(*inst["side_channel_ports"])], of(peers)))
            ruleset.append(_port_rule(
                "%s dp rpc" % inst["name"], "%s's data-parallel RPC: the host itself only" % inst["name"],
                [inst["dp_rpc_port"]], own))
        for pool, peers_pool in other_pool.items():
            if host not in pool_hosts.get((pool, cell_of.get(host)), ()):
                continue
            peers = kv_peers(pool, host)
            if kv_tcp:
                # UCX over TCP (no RDMA, as in the lab) listens on ephemeral ports on both sides and either
                # side may connect: allow that range from the KV peers. On RDMA the KV data path is not IP at
                # all (the kernel's firewall never sees it), so production opens nothing here.
                ruleset.append(_port_rule(
                    "kv tcp", "KV data path over UCX's TCP transport (ephemeral ports) from the hosts it "
                    "moves KV with (%s)" % ", ".join(peers), [kv_tcp], of(peers)))
            if pool == "prefill" and host in kv_check:
                ports = sorted(kv_check[host])
                ruleset.append(_port_rule(
                    "kv path check", "KV-path check listeners (verify_kv_path.yml) from the decode hosts",
                    [_span(ports[0], ports[-1])], of(sorted(pool_hosts.get(("decode", cell_of[host]), ())))))
        if host in serving_hosts and inputs.get("model_fanout_port") is not None:
            ruleset.append(_port_rule(
                "model fanout", "model weights fan-out from the seed host to the other serving hosts",
                [inputs["model_fanout_port"]], of([h for h in serving_hosts if h != host])))
        for router in (r for r in routers if r["host"] == host):
            if str(router.get("bind")) != "127.0.0.1":
                ruleset.append(_port_rule(
                    "router", "the router (and its standby during an upgrade, its aggregated router) from the "
                    "front-door hosts (%s)" % ", ".join(frontdoor["hosts"]),
                    [router[k] for k in ("port", "standby_port", "aggregated_port") if router.get(k)],
                    of(frontdoor["hosts"])))
            ruleset.append(_port_rule("router metrics", "the router's metrics from Prometheus and the admin networks",
                                      [router[k] for k in ("metrics_port", "standby_metrics_port",
                                                           "aggregated_metrics_port") if router.get(k)],
                                      monitors))
        if host in frontdoor["hosts"]:
            peers = [h for h in frontdoor["hosts"] if h != host]
            if frontdoor.get("port"):
                # With a virtual address, the other front-door hosts too: each checks that the address answers.
                ruleset.append(_port_rule("frontdoor", "the front door (HTTPS) from the client networks%s"
                                          % (" and the other front-door hosts" if frontdoor.get("vip") and peers else ""),
                                          [frontdoor["port"]], clients + [a for a in (of(peers) if frontdoor.get("vip") else [])
                                                                          if not address_in_networks(a, clients)]))
            if frontdoor.get("vip") and peers:
                ruleset.append(dict(_port_rule("vrrp", "VRRP (IP protocol 112, keepalived: the front door's virtual "
                                               "address %s) from the other front-door hosts (%s)"
                                               % (frontdoor["vip"]["address"], ", ".join(peers)), [], of(peers)),
                                    proto="vrrp", ports=[]))
            if frontdoor.get("metrics_port"):
                ruleset.append(_port_rule("frontdoor metrics",
                                          "the front door's metrics from Prometheus and the admin networks",
                                          [frontdoor["metrics_port"]], monitors))
        if inputs.get("node_exporter_port"):
            ruleset.append(_port_rule("node exporter", "node exporter from Prometheus and the admin networks",
                                      [inputs["node_exporter_port"]], monitors))
        if host in serving_hosts and inputs.get("dcgm_exporter_port"):
            ruleset.append(_port_rule("dcgm exporter", "DCGM exporter from Prometheus and the admin networks",
                                      [inputs["dcgm_exporter_port"]], monitors))
        if host == monitoring_host and inputs.get("prometheus_port"):
            ruleset.append(_port_rule("prometheus", "Prometheus from the admin networks",
                                      [inputs["prometheus_port"]], admin))
        out[host] = [r for r in ruleset if "sources" not in r or r["sources"]]
    return out


def allowed(host_rules, port, source):
    """The names of the rules that accept TCP `port` from `source` (tests and the render's reader)."""
    names = []
    for rule in host_rules:
        if rule.get("proto") != "tcp" or rule["action"] != "accept":
            continue
        if not address_in_networks(source, rule["sources"]):
            continue
        for span in rule["ports"]:
            lo, dummy, hi = span.partition("-")
            if int(lo) <= int(port) <= int(hi or lo):
                names.append(rule["name"])
    return names
