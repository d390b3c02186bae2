"""pdctl: operator commands for the P/D vLLM deployment (plan, render, run, lab, gates)."""


def _use_ansible_collection_loader() -> None:
    """Import the collection's code (`ansible_collections.pdctl.vllm_pd...`) through Ansible's own
    collection loader, in every process that imports pdctl, as Ansible does in its own.

    Python alone would import `ansible_collections.pdctl.vllm_pd` as a plain namespace package, and
    once the loader is installed later (by any use of Ansible's inventory or templating) it cannot
    load the rest of that package next to it. Inside an Ansible module the loader already runs.
    """
    import sys

    # Inside an Ansible module (the gate modules import pdctl.gates) Ansible's controller code must not
    # mix in: its module_utils come from the module's payload zip (AnsiballZ), or, under Mitogen
    # (plugins/strategy/pdctl_linear.py), the module runs in a persistent interpreter that was handed its
    # arguments in ansible.module_utils.basic._ANSIBLE_ARGS.
    module_utils = sys.modules.get("ansible.module_utils")
    if ".zip" in (getattr(module_utils, "__file__", None) or ""):
        return
    if getattr(sys.modules.get("ansible.module_utils.basic"), "_ANSIBLE_ARGS", None) is not None:
        return
    try:
        from ansible.utils.collection_loader import AnsibleCollectionConfig
    except ImportError:  # no Ansible in this environment (a lab host's engine venv)
        return
    if AnsibleCollectionConfig.collection_finder is None:
        from ansible.plugins.loader import init_plugin_loader

        init_plugin_loader()


_use_ansible_collection_loader()
