"""Read an Ansible inventory the way ansible-playbook does (group_vars, host_vars, vault), offline."""
from __future__ import annotations

import os
from pathlib import Path

from pdctl import collection
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import defaults_layer, topology, varnames


class InventoryError(Exception):
    pass


def _layer(loader) -> dict:
    """The defaults layer as a play loads role defaults: through Ansible's loader, its templates trusted (ansible-core
    2.19 templates only trusted strings: read as plain YAML, `{{ pdctl_versions.flashinfer }}` stayed literal and
    `pdctl stage` asked the registry for it). Files in name order, a later one winning, as Ansible reads them."""
    layer = {}
    for path in defaults_layer.files(str(collection.root())):
        layer.update(loader.load_from_file(path, trusted_as_template=True) or {})
    return layer


def _plain(value):
    """Ansible's tagged containers and strings as plain Python data (what callers dump to YAML or JSON)."""
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    for kind in (bool, str, int, float):  # bool before int: True is an int
        if isinstance(value, kind):
            return kind(value)
    return value


def _has_template(value) -> bool:
    """Whether a value holds Jinja anywhere (what templating would change)."""
    if isinstance(value, dict):
        return any(_has_template(k) or _has_template(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_template(v) for v in value)
    return isinstance(value, str) and any(mark in value for mark in ("{{", "{%", "{#"))


def _extra_vars(loader, values) -> dict:
    """`-e` values as ansible-playbook reads them (`@FILE`, JSON or YAML, `k=v ...`), later ones winning."""
    from ansible.errors import AnsibleError
    from ansible.parsing.splitter import parse_kv

    found = {}
    for value in values:
        if value.startswith("@"):
            data = loader.load_from_file(value[1:], trusted_as_template=True)
        elif value.lstrip().startswith(("{", "[")):
            data = loader.load(value)
        else:
            data = parse_kv(value)
        if not isinstance(data, dict):
            raise AnsibleError("extra vars %r: not a mapping of variables" % value)
        found.update(data)
    return found


def load(inventory: str | os.PathLike, names=None, extra_vars=()) -> dict:
    """Return {host: {"groups": [...], "vars": {...}}} with the named variables templated.

    names: the variables wanted (default: the planner's inputs).
    extra_vars: `-e` values, over everything else (ansible-playbook's precedence), so a check of the inventory
    sees what the run will.

    Vault-encrypted values are left encrypted (never decrypted here): the planner needs none.
    """
    path = Path(inventory)
    if not path.exists():
        raise InventoryError("inventory %s does not exist" % path)
    os.environ.setdefault("ANSIBLE_CONFIG", str(collection.root() / "ansible.cfg"))
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager
    loader = DataLoader()
    try:
        inv = InventoryManager(loader=loader, sources=[str(path)])
        variables = VariableManager(loader=loader, inventory=inv)
        layer = _layer(loader)
        extra = _extra_vars(loader, extra_vars)
        hosts = {}
        for host in inv.get_hosts():
            raw = variables.get_vars(host=host, include_hostvars=False)
            # What a play sees: the whole defaults layer (roles/pdctl_defaults) under the inventory, so a wanted
            # value can template from a layer name not wanted itself (_pdctl_flashinfer_cuda in pdctl_stage_wheels).
            # playbook_dir: the collection's playbooks, as a play of them has it, not the working directory (the lab
            # keeps its records beside them).
            hv = {**layer, **raw, "playbook_dir": str(collection.root() / "playbooks"), **extra}
            wanted = {k: v for k, v in hv.items() if k in (names or topology.PLAN_VARS)}
            # Only values that hold a template need the host's variables: most are plain data (the layer's ports,
            # pools, hardware profile), and templating walks all of it, for every host of a fleet.
            templated = [k for k, v in wanted.items() if _has_template(v)]
            if templated:
                templar = Templar(loader=loader, variables=hv)
                wanted.update(templar.template({k: wanted[k] for k in templated}))
            hosts[host.name] = {
                "groups": sorted(g.name for g in host.get_groups() if g.name != "all"),
                "vars": _plain(wanted),
                "names": varnames.unread_names(raw),  # the planner refuses a pdctl_* name nothing reads
            }
    except AnsibleError as exc:
        raise InventoryError("cannot read inventory %s: %s" % (path, exc)) from exc
    if not hosts:
        raise InventoryError("inventory %s has no hosts" % path)
    return hosts


def plan(inventory: str | os.PathLike, extra_vars=()) -> dict:
    """Load the inventory (with any `-e` values) and compute the serving plan (raises the planner's PlanError)."""
    return topology.build_plan(load(inventory, extra_vars=extra_vars))


def artifacts_dir(inventory: str | os.PathLike, extra_vars=()) -> Path:
    """Where the playbooks keep this inventory's run records: `pdctl_artifacts_dir` as a play sees it (the layer's
    default is the inventory's own artifacts/; this repository's inventories name the checkout's)."""
    hosts = load(inventory, names=["pdctl_artifacts_dir"], extra_vars=extra_vars)
    return Path(next(iter(hosts.values()))["vars"]["pdctl_artifacts_dir"])
