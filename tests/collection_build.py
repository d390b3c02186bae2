"""The collection as a user gets it, for the tests that need it (a pytest fixture, imported by them)."""
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

from pdctl import collection

ROOT = collection.root()


GALAXY = str(Path(sys.executable).parent / "ansible-galaxy")


@pytest.fixture(scope="session")
def collection_tarball(tmp_path_factory):
    """`ansible-galaxy collection build` of this checkout: the tarball's path."""
    build = tmp_path_factory.mktemp("build")
    subprocess.run([GALAXY, "collection", "build", str(ROOT), "--output-path", str(build)],
                   check=True, capture_output=True, text=True)
    return next(build.glob("pdctl-vllm_pd-*.tar.gz"))


# The lab's parts that sit among the collection's own files, left out of the tarball (galaxy.yml build_ignore): its
# engine stand-in's documentation. Its emulated-hardware role is the bench's (src/pdctl/lab/ansible/roles), so
# no role of the collection is the lab's.
LAB_ROLE_DIR = ROOT / "src" / "pdctl" / "lab" / "ansible" / "roles"
LAB_FILES = ("docs/engine-standin.md",)


def tarball_names(tarball) -> list:
    """Every entry of a built collection tarball."""
    with tarfile.open(tarball) as tar:
        return tar.getnames()


def tarball_text(tarball, name) -> str:
    with tarfile.open(tarball) as tar:
        return tar.extractfile(name).read().decode()


@pytest.fixture(scope="session")
def installed_collection(tmp_path_factory, collection_tarball):
    """The collection as a user gets it: the built tarball `install`ed into an empty path (--force: this
    checkout is linked into the venv as the same collection). Its dependencies come from the ansible
    package's own copies (Galaxy is not reachable here)."""
    base = tmp_path_factory.mktemp("collection")
    galaxy = GALAXY
    tarball = collection_tarball
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
