"""Stage the Python packages the hosts install into the artifact store's wheels/ directory.

Hosts run `pip install --no-index --find-links <store>/wheels/`, so everything they need, with
dependencies, must be here as wheels built for the hosts' Python and platform. Each install set
(one venv: the engine release, the router) gets a lock, `requirements-<set>.txt` beside the wheels:
every wheel of the set, dependencies included, pinned with its sha256. The hosts install with
`--require-hashes --no-deps -r <lock>`, so a wheel that is not the staged one is refused.

    python -m pdctl.wheelhouse lock DIR SET REQUIREMENT... [--no-deps REQUIREMENT...] [--sign KEY_DIR]

Each lock is also published clearsigned with the store key (requirements-<set>.txt.asc, `--sign`):
the hosts install only from a lock whose signature gpgv verifies with that key.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
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


# -- locks -----------------------------------------------------------------------------------------

def lock_name(install_set: str) -> str:
    return "requirements-%s.txt" % install_set


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _resolve(requirements: list[str], wheel_dir: Path, no_deps: bool, python_version: str | None,
             platforms: tuple[str, ...]) -> list[tuple[str, str, Path]]:
    """What pip would install for the requirements from wheel_dir alone: [(name, version, wheel file)]."""
    if not requirements:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", str(report), "--no-index", "--find-links", str(wheel_dir), "--only-binary=:all:"]
        if no_deps:
            cmd.append("--no-deps")
        if python_version:
            cmd += ["--python-version", python_version]
        for platform in platforms:
            cmd += ["--platform", platform]
        # Only the wheelhouse counts: no pip configuration (index, constraints) of this machine.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull
        res = subprocess.run(cmd + list(requirements), capture_output=True, text=True, env=env)
        if res.returncode != 0:
            raise RuntimeError("resolving %s in %s failed: %s" % (" ".join(requirements), wheel_dir,
                                                                 res.stderr.strip()[-2000:]))
        items = json.loads(report.read_text())["install"]
    resolved = []
    for item in items:
        url = item["download_info"]["url"]
        path = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
        if path.parent.resolve() != wheel_dir.resolve() or path.suffix != ".whl":
            raise RuntimeError("%s resolved to %s, not a wheel in %s" % (item["metadata"]["name"], url, wheel_dir))
        resolved.append((_canonical(item["metadata"]["name"]), item["metadata"]["version"], path))
    return resolved


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_lock(wheel_dir: Path, install_set: str, requirements: list[str], no_deps: list[str] = (),
               python_version: str | None = None, platforms: tuple[str, ...] = ()) -> Path:
    """Write wheel_dir/requirements-<set>.txt: every wheel the set installs, with its sha256.

    requirements are resolved with their dependencies, no_deps without (as they were downloaded).
    Every wheel of a pinned name and version in wheel_dir is listed (a host picks the one for its
    Python and platform), and nothing that is not in wheel_dir.
    """
    pins: dict[str, tuple[str, set[Path]]] = {}
    for name, version, path in (_resolve(list(requirements), wheel_dir, False, python_version, platforms)
                                + _resolve(list(no_deps), wheel_dir, True, python_version, platforms)):
        if name in pins and pins[name][0] != version:
            raise RuntimeError("%s resolves to %s and %s in set %s" % (name, pins[name][0], version, install_set))
        pins.setdefault(name, (version, set()))[1].add(path)
    for wheel in wheel_dir.glob("*.whl"):  # the same release built for other Pythons/platforms
        dist, version = wheel.name.split("-")[:2]
        if _canonical(dist) in pins and pins[_canonical(dist)][0] == version:
            pins[_canonical(dist)][1].add(wheel)
    lines = ["# %s: the wheels of install set %s with their sha256 (pdctl.wheelhouse; do not edit)." % (
        lock_name(install_set), install_set),
        "# pip install --require-hashes --no-deps --no-index --find-links <store>/wheels/ -r <this file>"]
    for name in sorted(pins):
        version, paths = pins[name]
        hashes = " ".join("--hash=sha256:%s" % h for h in sorted({_sha256(p) for p in paths}))
        lines.append("%s==%s %s" % (name, version, hashes))
    target = wheel_dir / lock_name(install_set)
    text = "\n".join(lines) + "\n"
    if not target.exists() or target.read_text() != text:
        tmp = target.with_suffix(".part")
        tmp.write_text(text)
        tmp.replace(target)
    return target


# -- signed locks ----------------------------------------------------------------------------------
# The lock says which wheels are genuine, so it must itself be genuine: whoever can change the store
# could change a wheel and its hash together. Each lock is published clearsigned with the store key
# (the key that signs the apt repository) as <store>/locks/<lock>.asc; a host reads only that, verifies it with gpgv
# against the key host_base installed, and hands pip the verified text (roles/vllm, roles/router).

SIGNED_SUFFIX = ".asc"
SIGNED_DIR = "locks"  # <store>/locks/requirements-<set>.txt.asc, beside <store>/wheels/


def signed_name(install_set: str) -> str:
    return lock_name(install_set) + SIGNED_SUFFIX


def verify_lock(signed: Path, keyring: Path) -> str | None:
    """The lock text signed.asc carries if its signature verifies with keyring (binary), else None."""
    res = subprocess.run(["gpgv", "--keyring", str(keyring), "--output", "-", str(signed)], capture_output=True)
    return res.stdout.decode() if res.returncode == 0 else None


def sign_lock(key_dir: Path, lock: Path, target_dir: Path | None = None) -> Path:
    """Clearsign lock with the store key into <target_dir or lock's dir>/<lock name>.asc (kept when it
    already verifies and carries lock's text); return its path."""
    from pdctl import apt_signing

    signed = (target_dir or lock.parent) / (lock.name + SIGNED_SUFFIX)
    signed.parent.mkdir(parents=True, exist_ok=True)
    text = lock.read_text()
    tmp = signed.with_name(signed.name + ".part")
    with apt_signing.session(key_dir) as fpr:
        if signed.exists() and verify_lock(signed, key_dir / apt_signing.PUBLIC_GPG) == text:
            return signed
        tmp.unlink(missing_ok=True)
        apt_signing.clearsign(key_dir, fpr, lock, tmp)
    if verify_lock(tmp, key_dir / apt_signing.PUBLIC_GPG) != text:
        raise RuntimeError("the signature just made for %s does not verify to its text" % lock)
    tmp.replace(signed)
    return signed


def read_lock(path: Path) -> dict[str, tuple[str, list[str]]]:
    """{name: (version, [sha256, ...])} of a lock written by write_lock."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *options = line.split()
        name, version = spec.split("==", 1)
        pins[name] = (version, [o.split(":", 1)[1] for o in options if o.startswith("--hash=sha256:")])
    return pins


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pdctl.wheelhouse", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    lk = sub.add_parser("lock", help="write the hash-pinned lock of one install set")
    lk.add_argument("wheel_dir", type=Path)
    lk.add_argument("install_set", help="e.g. vllm-0.33.0 or router-0.1.17 (the roles' lock names)")
    lk.add_argument("requirements", nargs="+")
    lk.add_argument("--no-deps", nargs="*", default=[], help="requirements staged without their dependencies")
    lk.add_argument("--python-version")
    lk.add_argument("--platform", action="append", default=[])
    lk.add_argument("--sign", type=Path, metavar="KEY_DIR",
                    help="clearsign the lock with the store key in KEY_DIR (python -m pdctl.apt_signing key)")
    args = p.parse_args(argv)
    path = write_lock(args.wheel_dir, args.install_set, args.requirements, args.no_deps,
                      args.python_version, tuple(args.platform))
    print("%s: %d wheels" % (path, len(read_lock(path))))
    if args.sign:
        print("signed: %s" % sign_lock(args.sign, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
