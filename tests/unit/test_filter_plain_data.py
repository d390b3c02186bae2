"""The profile merge behind the filters copies Ansible's containers as plain data, never with
copy.deepcopy (which copies a lazy container's templating context: 1.6 s a site.yml run on the lab)."""

from ansible_collections.pdctl.vllm_pd.plugins.filter.pdctl import kv_nics, plan
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import hwprofile, topology
from inventories import ROOT
from pdctl import inventory


class NoCopy(dict):
    """A dict that refuses to be deep-copied, as a stand-in for Ansible's lazily templated dict
    (a dict subclass whose deep copy carries its templating context)."""

    def __deepcopy__(self, memo):
        raise AssertionError("the filter deep-copied Ansible's container")


class NoCopyList(list):
    def __deepcopy__(self, memo):
        raise AssertionError("the filter deep-copied Ansible's container")


def test_overrides_are_read_as_plain_data():
    overrides = {"gpu": {"cpu_affinity": ["0", "0", "0", "0", "1", "1", "1", "1"]}}
    expected = hwprofile.kv_nics(hwprofile.resolve(overrides))
    assert kv_nics(_no_copy(overrides)) == expected
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


def test_plan_reads_each_hosts_variables_as_plain_data():
    """The plan merges each host's pdctl_hw_profile over the default: from the lazy containers of
    hostvars it must copy plain data (1.6 s a site.yml run on the lab otherwise)."""
    hosts = inventory.load(ROOT / "inventories/lab")
    hosts["lab-prefill-0"]["vars"]["pdctl_hw_profile"] = {"gpu": {"count": 8}, "nics": []}
    hostvars = {name: _no_copy({"group_names": h["groups"], **h["vars"]}) for name, h in hosts.items()}
    groups = {"all": list(hosts)}
    result = plan(hostvars, groups)
    assert result == {"plan": topology.build_plan(hosts), "errors": []}


def test_merge_never_aliases_its_inputs():
    base = {"gpu": {"count": 1, "bus_ids": ["0000:01:00.0"]}, "nics": [{"name": "mlx5_0"}]}
    override = {"gpu": {"count": 2}, "nics": [{"name": "mlx5_1"}]}
    out = hwprofile.merge(base, override)
    assert out == {"gpu": {"count": 2, "bus_ids": ["0000:01:00.0"]}, "nics": [{"name": "mlx5_1"}]}
    out["gpu"]["bus_ids"].append("0000:02:00.0")
    out["nics"][0]["name"] = "changed"
    assert base == {"gpu": {"count": 1, "bus_ids": ["0000:01:00.0"]}, "nics": [{"name": "mlx5_0"}]}
    assert override == {"gpu": {"count": 2}, "nics": [{"name": "mlx5_1"}]}
