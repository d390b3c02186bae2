"""Stage the Python packages the hosts install into the artifact store's wheels/ directory.

Hosts run `pip install --no-index --find-links <store>/wheels/`, so everything they need, with
dependencies, must be here as wheels built for the hosts' Python and platform.
"""
from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path


def download(requirements: list[str], dest: Path, python_version: str | None = None,
             platforms: tuple[str, ...] = (), no_deps: bool = False) -> None:
    """pip download the requirements (with dependencies) as wheels for the target interpreter."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(dest),
           "--find-links", str(dest)]
    if no_deps:
        cmd.append("--no-deps")
    if python_version:
        cmd += ["--python-version", python_version]
    for platform in platforms:
        cmd += ["--platform", platform]
    res = subprocess.run(cmd + list(requirements), capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError("pip download %s failed: %s" % (" ".join(requirements), res.stderr.strip()[-2000:]))


# The wheel format (PEP 427 / the binary distribution spec): a zip with the package files and a
# .dist-info directory. Writing it directly needs no build backend, so the result depends only on
# this code and the files given, never on which setuptools/wheel a virtualenv happens to carry.
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: the same inputs give a byte-identical wheel


def build_pure_wheel(dest: Path, name: str, version: str, files: dict[str, bytes], requires: list[str],
                     console_scripts: dict[str, str] | None = None, requires_python: str = ">=3.11") -> Path:
    """Write a pure-Python wheel of `files` ({archive path: content}) into dest; return its path."""
    dist = re.sub(r"[-_.]+", "_", name).lower()
    info = "%s-%s.dist-info" % (dist, version)
    metadata = ["Metadata-Version: 2.1", "Name: %s" % name, "Version: %s" % version,
                "Requires-Python: %s" % requires_python] + ["Requires-Dist: %s" % r for r in requires]
    members = dict(sorted(files.items()))
    members[info + "/METADATA"] = ("\n".join(metadata) + "\n").encode()
    members[info + "/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: pdctl\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if console_scripts:
        members[info + "/entry_points.txt"] = ("[console_scripts]\n" + "".join(
            "%s = %s\n" % item for item in sorted(console_scripts.items()))).encode()
    record = []
    for path, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (path, digest, len(data)))
    members[info + "/RECORD"] = ("\n".join(record + [info + "/RECORD,,"]) + "\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / ("%s-%s-py3-none-any.whl" % (dist, version))
    tmp = target.with_suffix(".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in members.items():
            entry = zipfile.ZipInfo(path, date_time=_EPOCH)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(entry, data)
    tmp.replace(target)
    return target
