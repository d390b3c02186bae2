"""The collection as a site gets it: `ansible-galaxy collection build` of this checkout, installed into an empty
collections path with nothing else of this checkout visible. The tests' installed-collection fixture and the
molecule scenario `installed` both use it.

    python -m pdctl.lab.installed DEST    # DEST/ansible_collections/pdctl/vllm_pd (printed)
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from pdctl import collection

GALAXY = str(Path(sys.executable).parent / "ansible-galaxy")
# The collection's dependencies (galaxy.yml), taken from the ansible package's own copies: Galaxy is not
# reachable from here (nor, for a site, from its hosts; its controller installs them as it installs Ansible).
DEPENDENCIES = ("ansible/posix", "community/general")


def build(out: Path) -> Path:
    """The built tarball of this checkout, in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([GALAXY, "collection", "build", str(collection.root()), "--output-path", str(out), "--force"],
                   check=True, capture_output=True, text=True)
    return next(out.glob("pdctl-vllm_pd-*.tar.gz"))


def install(tarball: Path, path: Path) -> Path:
    """`tarball` installed under the collections path `path` (replacing what was there, --force: this checkout is
    linked into the venv as the same collection), with its dependencies; the installed collection's directory."""
    subprocess.run([GALAXY, "collection", "install", "--no-deps", "--force", "-p", str(path), str(tarball)],
                   check=True, capture_output=True, text=True)
    bundled = Path(sysconfig.get_paths()["purelib"]) / "ansible_collections"
    for dep in DEPENDENCIES:
        dest = path / "ansible_collections" / dep
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(bundled / dep, dest, symlinks=True)
    installed = path / "ansible_collections" / "pdctl" / "vllm_pd"
    if installed.is_symlink() or not (installed / "MANIFEST.json").is_file():
        raise RuntimeError("%s: not an installed copy of the collection" % installed)
    return installed


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pdctl.lab.installed DEST (a collections path to install into)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="pdctl-build-") as tmp:
        print(install(build(Path(tmp)), Path(args[0]).resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
