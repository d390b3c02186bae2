"""The kv_nics filter reads Ansible's containers without deep-copying them."""
from collections.abc import Mapping

from ansible_collections.pdctl.vllm_pd.plugins.filter.pdctl import kv_nics
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import hwprofile


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
