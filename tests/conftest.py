"""Test-wide settings. The tests import the collection's code the one way everything else does
(`ansible_collections.pdctl.vllm_pd...`, linked by scripts/bootstrap), and their helper modules
through pytest's `pythonpath` setting (pyproject.toml)."""
# Before any test module imports the collection: pdctl puts Ansible's collection loader in place
# (see pdctl._use_ansible_collection_loader).
import pdctl  # noqa: F401

import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import sysconfig  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from inventories import ROOT  # noqa: E402


@pytest.fixture(scope="session")
def installed_collection(tmp_path_factory):
    """The collection as a user gets it: `ansible-galaxy collection build`, then `install` into an empty
    path (--force: this checkout is linked into the venv as the same collection). Its dependencies come
    from the ansible package's own copies (Galaxy is not reachable here)."""
    base = tmp_path_factory.mktemp("collection")
    galaxy = str(Path(sys.executable).parent / "ansible-galaxy")
    subprocess.run([galaxy, "collection", "build", str(ROOT), "--output-path", str(base / "build")],
                   check=True, capture_output=True, text=True)
    tarball = next((base / "build").glob("pdctl-vllm_pd-*.tar.gz"))
    path = base / "collections"
    subprocess.run([galaxy, "collection", "install", "--no-deps", "--force", "-p", str(path), str(tarball)],
                   check=True, capture_output=True, text=True)
    bundled = Path(sysconfig.get_paths()["purelib"]) / "ansible_collections"
    for dep in ("ansible/posix", "community/general"):
        (path / "ansible_collections" / dep).parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(bundled / dep, path / "ansible_collections" / dep, symlinks=True)
    installed = path / "ansible_collections" / "pdctl" / "vllm_pd"
    assert (installed / "plugins" / "modules" / "nvlink_check.py").is_file() and not installed.is_symlink()
    return path
