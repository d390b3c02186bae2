"""Run our Ansible modules in-process: arguments through ansible-core 2.19's patch_module_args,
the JSON result read back from stdout (exit_json/fail_json exit the process, caught here)."""
from __future__ import annotations

import importlib.util
import json

import ansible.module_utils
import pytest
from ansible.module_utils.testing import patch_module_args

from inventories import ROOT

# Modules import shared code as ansible.module_utils.pdctl_*: make ours importable that way.
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))


def load(name):
    spec = importlib.util.spec_from_file_location("pdctl_lib_" + name, ROOT / "library" / (name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
