"""Run our Ansible modules in-process: arguments through ansible-core 2.19's patch_module_args,
the JSON result read back from stdout (exit_json/fail_json exit the process, caught here)."""
from __future__ import annotations

import importlib.util
import json

import pytest
from ansible.module_utils.testing import patch_module_args


def load(name):
    """The module pdctl.vllm_pd.<name>, imported as the collection package it is."""
    return importlib.import_module("ansible_collections.pdctl.vllm_pd.plugins.modules." + name)


def run(name, args, capsys, check_mode=False):
    """Run a module's main(); return (failed, result dict, raw stdout)."""
    if check_mode:
        args = dict(args, _ansible_check_mode=True)
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        load(name).main()
    out = capsys.readouterr().out
    result = json.loads(out)
    assert bool(exc.value.code) == bool(result.get("failed"))
    return bool(result.get("failed")), result, out
