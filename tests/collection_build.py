"""The collection as a user gets it, for the tests that need it (a pytest fixture, imported by them)."""
import string
import tarfile

import pytest
import yaml

from pdctl import collection
from pdctl.lab import installed as lab_installed

ROOT = collection.root()


@pytest.fixture(scope="session")
def collection_tarball(tmp_path_factory):
    """`ansible-galaxy collection build` of this checkout: the tarball's path."""
    return lab_installed.build(tmp_path_factory.mktemp("build"))


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
    """The collection as a user gets it (pdctl.lab.installed: the built tarball installed into an empty path,
    its dependencies from the ansible package's own copies): the collections path."""
    path = tmp_path_factory.mktemp("collection") / "collections"
    installed = lab_installed.install(collection_tarball, path)
    assert (installed / "plugins" / "modules" / "nvlink_check.py").is_file()
    return path


# The molecule scenario that deploys from the installed collection with an inventory of hosts and secrets only.
INSTALLED_SCENARIO = ROOT / "molecule" / "installed"


def installed_scenario_args() -> list:
    """The scenario's ansible-playbook arguments (its molecule.yml), molecule's variables filled in."""
    doc = yaml.safe_load((INSTALLED_SCENARIO / "molecule.yml").read_text())
    where = {"MOLECULE_SCENARIO_DIRECTORY": str(INSTALLED_SCENARIO), "MOLECULE_PROJECT_DIRECTORY": str(ROOT)}
    return [string.Template(a).substitute(where) for a in doc["ansible"]["executor"]["args"]["ansible_playbook"]]
