# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a run of playbooks/maintenance.yml does, from what the hosts say (docs/maintenance.md).

Host maintenance takes one serving host at a time out of service, runs the host stack (a new NVIDIA driver
release, a kernel update's reboot) and brings it back. The hosts say what is left to do, so a run that was
interrupted resumes where it stopped and a second run changes nothing:

- read(): one host's state, from the lines the first play's read prints (the loaded NVIDIA module, the
  driver release's installed packages, each planned instance's unit state, the decode turn's record, the
  reboot the host asks for): what is left to do on it, its instances that are down, whether it must reboot.
  A decode turn that an earlier run started and did not finish left its record (maintenance_turn_file,
  written before anything changes, removed at the turn's end): the host takes its turn again.
- order(): the hosts' turns. Prefill hosts first, the decode host last (its turn needs every prefill host
  but the lender serving). A prefill host whose instances are down already (one that failed its checks in
  an earlier run) goes first: taking it out costs no capacity, and the others need it back before they
  leave. Hosts with nothing to do take no turn.
- turn(): one host's turn. Its instances (by name); a decode turn (the host runs a decode instance: a
  temporary decode on the lender's GPUs serves meanwhile); whether it serves nothing (every instance down
  already: it takes its turn whatever the others do, and nothing of it leaves the routers); the lender
  (rollout_plan.lender); the prefill instances of the other hosts that must carry the service while it is
  out; how the new driver is taken into use (a host that runs a router or a front door reloads the module,
  it must not reboot: the service would stop); whether it runs a router (after a reboot the front doors take
  its aggregated router back); what a failed turn reads; the hosts done before it and those left, for the
  failure message.
- carriers(): whether the host may leave, from what its carriers say (enough prefill instances serve on).
- failed(): the message a failed turn stops the run with.
- summary(): what the run prints before its first turn, and the to-do its report starts with.
- rescue(): the membership the routers take when a turn fails: every instance but the host's, and in a
  decode turn the temporary decode where it still runs (the decode is not back).

Pure functions of plain data (the plan of topology.build_plan, lists of lines, {host: facts}), so each
resume point is unit-tested without hosts (tests/unit/plugins/module_utils/test_maintenance_decide.py).
"""
from __future__ import annotations

import re

from ansible_collections.pdctl.vllm_pd.plugins.module_utils.rollout_plan import PlanError, lender

# Lines of the first play's read: "module <version|none>", "package <name> <version>", "unit <unit> <state>",
# "turn <record>", "reboot <packages>".
_ACTIVE = re.compile(r".* active$")
# The temporary decode on the lender's GPUs (roles/vllm/tasks/temporary_decode.yml).
TEMPORARY, TEMPORARY_UNIT = "decode-temporary", "pdctl-vllm-decode-temporary.service"


def _lines(lines, prefix):
    return [line for line in lines or () if line.startswith(prefix)]


def reboot_needs(plan, host):
    """What a reboot of `host` would need so that the service does not stop with it: another router host, if
    it runs the only router; a second front-door host behind a virtual address, if it runs a front door."""
    routers = [r["host"] for r in plan.get("routers") or ()]
    frontdoor = plan.get("frontdoor") or {}
    hosts = frontdoor.get("hosts") or []
    needs = []
    if host in routers and len(routers) < 2:
        needs.append("another router host")
    if host in hosts and not (frontdoor.get("vip") and len(hosts) > 1):
        needs.append("a second front-door host behind a virtual address (pdctl_frontdoor_vip)")
    return needs


def read(lines, driver, turn_file, plan=None, host=None):
    """One host's state from the read's lines. driver: the manifest's NVIDIA driver release; turn_file: where
    a decode turn is recorded. -> {todo: [what is left, in words], instances_down: [the read's lines of
    instances not active], reboot_required: bool, reboot_needs: [what a reboot needs first] (with plan and
    host)}."""
    module = next(iter(_lines(lines, "module ")), "module none").split(" ")[1]
    packages = [line[len("package "):] for line in _lines(lines, "package ")]
    down = [line for line in _lines(lines, "unit ") if not _ACTIVE.match(line)]
    reboot = _lines(lines, "reboot")
    todo = [] if module == driver else ["NVIDIA kernel module %s loaded, %s in the manifest" % (module, driver)]
    # Installed packages of another release (held or not); the manifest's release has "<name> <driver>-<rev>".
    todo += ["package " + p for p in packages if not re.search(" %s-" % re.escape(str(driver)), p)]
    todo += ["instance " + line[len("unit "):] for line in down]
    if _lines(lines, "turn "):
        todo.append("an interrupted decode turn (%s)" % turn_file)
    if reboot:
        # Debian's and Ubuntu's packages write /run/reboot-required (a kernel update); an operator may too.
        pkgs = reboot[0][7:].strip()
        todo.append("a reboot (/run/reboot-required%s)" % (": " + pkgs if pkgs else ""))
    state = {"todo": todo, "instances_down": down, "reboot_required": bool(reboot)}
    if plan is not None:
        state["reboot_needs"] = reboot_needs(plan, host) if reboot else []
    return state


def _reloaders(groups):
    """The router and front-door hosts, each once: a reboot there would move the front door, so their
    maintenance reloads the driver module instead (unless the host needs a reboot)."""
    return list(dict.fromkeys(list(groups.get("router") or ()) + list(groups.get("frontdoor") or ())))


def order(groups, hostvars, play_hosts):
    """The hosts' turns, from each play host's read() facts (hostvars[host]: maintenance_todo,
    maintenance_instances_down, maintenance_reboot_required) and the inventory's groups. -> {hosts: the turns
    in order, reload_hosts: the router and front-door hosts that reload the driver module (those that do not
    have to reboot for a kernel update)}."""
    prefill = list(groups.get("prefill") or ())
    serving = prefill + list(groups.get("decode") or ())
    todo = [h for h in serving if h in play_hosts and hostvars[h].get("maintenance_todo")]
    down = [h for h in play_hosts if hostvars[h].get("maintenance_instances_down")]
    hosts = ([h for h in todo if h in prefill and h in down] + [h for h in todo if h in prefill and h not in down]
             + [h for h in todo if h not in prefill])
    reboot = [h for h in play_hosts if hostvars[h].get("maintenance_reboot_required")]
    reload_hosts = [h for h in _reloaders(groups) if h not in reboot]
    return {"hosts": hosts, "reload_hosts": reload_hosts}


def turn(plan, host, instances_down, groups, hosts=()):
    """One host's turn. instances_down: its read()'s; hosts: the run's turns in order (order()). -> {instances,
    decode_turn, serves_nothing, lender, carriers: the other hosts' prefill instances that serve while it is
    out (the lender aside in a decode turn), activation: reload | reboot, done: the turns before it, left: the
    turns after it}."""
    mine = sorted((i for i in plan["instances"] if i["host"] == host), key=lambda i: i["name"].lower())
    decode_turn = any(i["pool"] == "decode" for i in mine)
    lent = lender(plan)
    if decode_turn and lent is None:
        raise PlanError("%s runs a decode instance and the plan has no prefill instance to lend its GPUs to a "
                        "temporary decode" % host)
    carriers = [i for i in plan["instances"] if i["pool"] == "prefill" and i["host"] != host
                and not (decode_turn and lent and i["name"] == lent["name"])]
    hosts = list(hosts)
    done = hosts[:hosts.index(host)] if host in hosts else []
    # What a failed turn reads (rescue()): its instances and, in a decode turn, the lender and the temporary decode.
    probes = list(mine)
    if decode_turn:
        probes += [lent, {"name": TEMPORARY, "unit": TEMPORARY_UNIT, "host": lent["host"]}]
    return {"host": host, "instances": mine, "urls": [i["url"] for i in mine], "decode_turn": decode_turn,
            "serves_nothing": len(instances_down or ()) >= len(mine),
            "lender": lent, "carriers": carriers, "probes": probes,
            "router_host": host in [r["host"] for r in plan.get("routers") or ()],
            "activation": "reload" if host in _reloaders(groups) else "reboot",
            "done": done, "left": [h for h in hosts if h not in done and h != host]}


def carriers(turn_, active, minimum=None):
    """Whether the host may leave: the prefill instances of the other hosts that serve now (active: the names of
    turn()'s carriers that systemd says are active) are `minimum` at least (pdctl_min_prefill_instances, default
    1), or the host serves nothing already. -> {ok, serving: those names, msg: why not}."""
    names = {c["name"] for c in turn_["carriers"]}
    serving = [n for n in active if n in names]
    minimum = int(minimum or 1)
    msg = ("%s stays in service: while it is out, %d prefill instance(s) would serve (%s), fewer than %d "
           "(pdctl_min_prefill_instances, default 1). Bring the other prefill hosts back first (`pdctl maintain "
           "--limit HOST`, or site.yml); nothing was touched."
           % (turn_["host"], len(serving), ", ".join(serving) or "none", minimum))
    return {"ok": len(serving) >= minimum or turn_["serves_nothing"], "serving": serving, "msg": msg}


def failed(turn_, failure):
    """The message a failed turn stops the run with. failure: {task, reason} of the task that failed."""
    return ("%s is out of service: %s: %s Its instances (%s) stay stopped and no router sends to them; %shosts done: "
            "%s; not touched: %s. Fix the host and run `pdctl maintain` again: it resumes with this host."
            % (turn_["host"], failure.get("task", "?"), failure.get("reason", "failed"),
               ", ".join(i["name"] for i in turn_["instances"]),
               "the temporary decode serves in place of the decode; " if turn_["decode_turn"] else "",
               ", ".join(turn_["done"]) or "none", ", ".join(turn_["left"]) or "none"))


def summary(hosts, hostvars, driver):
    """What the run does, before its first turn. hosts: order()'s; hostvars[host]: read()'s facts
    (maintenance_todo); driver: the manifest's release. -> {todo: {host: todo} of the hosts that take a turn
    (the run's report starts with it), lines: what the run prints}."""
    todo = {h: list(hostvars[h].get("maintenance_todo") or ()) for h in hosts}
    if not hosts:
        lines = ["Nothing to do: every host runs NVIDIA driver %s with its instances up." % driver]
    else:
        lines = ["Hosts to maintain, one at a time, in this order (driver %s):" % driver]
        lines += ["%s: %s" % (h, "; ".join(todo[h])) for h in hosts]
    return {"todo": todo, "lines": lines}


def rescue(plan, instances, lent, running):
    """The routers' membership after a failed turn. instances: the turn's; lent: its lender; running: the
    names of what runs now, among the turn's instances, the lender and "decode-temporary" (a decode turn).
    -> {temporary: whether the temporary decode still serves, prefill_urls, decode_urls}."""
    out = {i["url"] for i in instances}
    temporary = TEMPORARY in running
    prefill = [i["url"] for i in plan["instances"] if i["pool"] == "prefill" and i["url"] not in out
               and not (temporary and i["url"] == lent["url"])]
    decode = [lent["url"]] if temporary else [i["url"] for i in plan["instances"] if i["pool"] == "decode" and i["url"] not in out]
    return {"temporary": temporary, "prefill_urls": prefill, "decode_urls": decode}
