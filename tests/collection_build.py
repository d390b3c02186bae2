"""The collection as a user gets it, for the tests that need it (a pytest fixture, imported by them)."""
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from pdctl import collection

ROOT = collection.root()


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
