"""The filters that feed the profile merge (which deep-copies) read Ansible's containers as plain data."""
from collections.abc import Mapping

from ansible_collections.pdctl.vllm_pd.plugins.filter.pdctl import kv_nics, plan
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import hwprofile, topology
from inventories import ROOT
from pdctl import inventory


class NoCopy(Mapping):
    """A read-only mapping that refuses to be deep-copied, as a stand-in for Ansible's lazily
    templated dict (whose deep copy carries its templating context)."""

    def __init__(self, data):
        self._data = data

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)

    def __deepcopy__(self, memo):
        raise AssertionError("the filter deep-copied Ansible's container")


def test_overrides_are_read_as_plain_data():
    overrides = {"gpu": {"cpu_affinity": ["0", "0", "0", "0", "1", "1", "1", "1"]}}
    expected = hwprofile.kv_nics(hwprofile.resolve(overrides))
    assert kv_nics(NoCopy({"gpu": NoCopy(overrides["gpu"])})) == expected
    assert expected == ["mlx5_0", "mlx5_1", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_10", "mlx5_11"]


def test_no_overrides_is_the_default_profile():
    assert kv_nics(None) == hwprofile.kv_nics(hwprofile.resolve({}))


def _no_copy(value):
    """value with every dict and list wrapped as Ansible would hand it over (lazy containers)."""
    if isinstance(value, dict):
        return NoCopy({key: _no_copy(item) for key, item in value.items()})
    if isinstance(value, list):
        return NoCopyList(_no_copy(item) for item in value)
    return value


class NoCopyList(list):
    def __deepcopy__(self, memo):
        raise AssertionError("the filter deep-copied Ansible's container")


def test_plan_reads_each_hosts_variables_as_plain_data():
    """The plan merges each host's pdctl_hw_profile over the default: from the lazy containers of
    hostvars it must copy plain data (1.6 s a site.yml run on the lab otherwise)."""
    hosts = inventory.load(ROOT / "inventories/lab")
    hosts["lab-prefill-0"]["vars"]["pdctl_hw_profile"] = {"gpu": {"count": 8}, "nics": []}
    hostvars = {name: _no_copy({"group_names": h["groups"], **h["vars"]}) for name, h in hosts.items()}
    groups = {"all": list(hosts)}
    result = plan(hostvars, groups)
    assert result == {"plan": topology.build_plan(hosts), "errors": []}
