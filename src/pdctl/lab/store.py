"""The lab's artifact store: staged on the controller, served to the test hosts on the lab network.

Debian packages: the roles declare what they install per OS in roles/*/vars/Debian.yml (keys
ending in `_packages`); the lab resolves exactly those against the pristine image root, so the
repository holds each package plus the dependencies the image lacks, and nothing else.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from pdctl import apt_signing, collection, wheelhouse
from pdctl.lab import daemon, image

GATEWAY = "10.89.64.1"  # the lab network's gateway: this machine, as the test hosts see it
PORT = 8780
SIGNING_DIR = "apt-signing"  # under the lab dir: the key that signs the store's apt repository


def declared_debian_packages() -> list[str]:
    names = set()
    for path in sorted(collection.root().glob("roles/*/vars/Debian*.yml")):
        data = yaml.safe_load(path.read_text()) or {}
        for key, value in data.items():
            if key.endswith("_packages") and isinstance(value, list):
                names.update(str(v) for v in value)
    return sorted(names)


def stage_apt(store_dir: Path) -> Path:
    """Build a flat apt repository (Packages, Release) of the declared packages under store/apt,
    signed with the key in <lab dir>/apt-signing (store_dir's parent is the lab dir).

    Packages that the lab replaces with stand-ins (GPU driver, fabric manager, CUDA, DOCA, GDRCopy:
    pdctl.lab.standin_debs) are not resolved against Debian; their .debs are built and added instead.
    """
    from pdctl.lab import standin_debs

    standins = standin_debs.names()
    packages = [p for p in declared_debian_packages() if p not in standins]
    root = image.base_rootfs()
    key = hashlib.sha256(("\0".join([root.name, standin_debs.fingerprint()] + packages)).encode()).hexdigest()[:12]
    staged = image.cache_dir() / ("apt-" + key)
    if not (staged / "Release").exists():
        t0 = time.monotonic()
        archives = root / "var/cache/pdctl-stage"
        shutil.rmtree(archives, ignore_errors=True)
        (archives / "partial").mkdir(parents=True)
        if packages:
            subprocess.run(["chroot", str(root), "apt-get", "install", "-y", "-qq", "--download-only",
                            "--no-install-recommends", "-o", "Dir::Cache::Archives=/var/cache/pdctl-stage",
                            *packages], check=True, stdout=subprocess.DEVNULL)
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir()
        for deb in archives.glob("*.deb"):
            shutil.move(str(deb), staged / deb.name)
        shutil.rmtree(archives)
        standin_debs.build(staged)
        with open(staged / "Packages", "w") as out:
            subprocess.run(["apt-ftparchive", "packages", "."], cwd=staged, check=True, stdout=out)
        release = subprocess.run(["apt-ftparchive", "release", "."], cwd=staged, check=True,
                                 capture_output=True, text=True).stdout
        (staged / "Release").write_text(release)
        print("lab: staged %d Debian packages and %d stand-ins (%d .deb with dependencies) in %.1fs"
              % (len(packages), len(standins), len(list(staged.glob("*.deb"))), time.monotonic() - t0), flush=True)
    return publish_apt(staged, store_dir / "apt", store_dir.parent / SIGNING_DIR)


def publish_apt(staged: Path, target: Path, key_dir: Path) -> Path:
    """Publish the staged repository under target, signed with this lab's key (made once, kept).

    The staged repository is cached across checkouts, each with its own key: target links to its
    files and holds its own copy of Release, signed (InRelease, Release.gpg) whenever it changes.
    """
    if target.is_symlink():  # the unsigned layout: a link to the cache
        target.unlink()
    target.mkdir(exist_ok=True)
    wanted = {p.name for p in staged.iterdir() if p.name != "Release"}
    for path in target.iterdir():
        if path.is_symlink() and path.name not in wanted:
            path.unlink()
    for name in sorted(wanted):
        link = target / name
        if not (link.is_symlink() and os.readlink(link) == str(staged / name)):
            link.unlink(missing_ok=True)
            link.symlink_to(staged / name)
    release = (staged / "Release").read_bytes()
    if not (target / "Release").exists() or (target / "Release").read_bytes() != release:
        for name in apt_signing.SIGNATURES:
            (target / name).unlink(missing_ok=True)
        (target / "Release").write_bytes(release)
    if apt_signing.sign(key_dir, target):
        print("lab: signed the apt repository with %s" % (key_dir / apt_signing.PUBLIC_ASC), flush=True)
    return target


def url() -> str:
    return "http://%s:%d" % (GATEWAY, PORT)


def ensure_started(lab_dir: Path):
    store_dir = lab_dir / "store"
    store_dir.mkdir(exist_ok=True)
    stage_apt(store_dir)
    if daemon.start(lab_dir, "store", [sys.executable, "-m", "pdctl.store", "--dir", str(store_dir),
                                       "--bind", GATEWAY, "--port", str(PORT)], url() + "/apt/Release"):
        print("lab: artifact store %s serving %s" % (url(), store_dir), flush=True)


def stop(lab_dir: Path):
    daemon.stop(lab_dir, "store")


def describe(lab_dir: Path) -> str:
    pid = daemon.running_pid(lab_dir, "store")
    return "%s (pid %d, %s)" % (url(), pid, lab_dir / "store") if pid else "not running"


# -- stand-ins of the upstreams the controller cannot reach here ------------------------------------

STANDIN_KEY_NAME = "upstream stand-in (not NVIDIA's key)"


def _standin_deb(folder: Path, package: str, version: str) -> Path:
    """An empty package of that name and version (dpkg-deb), as an upstream repository would carry it."""
    build = folder / (".build-" + package)
    (build / "DEBIAN").mkdir(parents=True, exist_ok=True)
    (build / "DEBIAN" / "control").write_text(
        "Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: pdctl-lab <lab@invalid>\n"
        "Description: stand-in of an upstream package (pdctl stage tests)\n" % (package, version))
    deb = folder / ("%s_%s_all.deb" % (package, version))
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(build), str(deb)], check=True,
                   capture_output=True)
    shutil.rmtree(build)
    return deb


def stage_upstream_standins(dest: Path, hv: dict) -> dict:
    """Stand-ins of the upstreams `pdctl stage` reads that this machine cannot reach (FlashInfer's
    index and release downloads, NVIDIA's apt repositories, the Hub's revision API), laid out as the real
    ones, under dest/<source name>/. hv: the inventory's variables as pdctl.stage.load reads them.

    Each pinned wheel is a small file of its own (the same name, other bytes); each apt repository is a
    flat index of the pinned packages at their versions, its InRelease signed with a stand-in key of
    its own. Returns {"sha256": {file: sha256}, "keys": {repository: key file}, "revision": commit}.
    """
    from pdctl import stage

    dest.mkdir(parents=True, exist_ok=True)
    out = {"sha256": {}, "keys": {}, "revision": hashlib.sha1(b"pdctl stand-in model").hexdigest()}
    for pin in hv.get("pdctl_stage_wheels") or []:
        base = dest / pin["source"]
        folder = base if pin.get("layout") == "files" else base / stage._canonical(pin["name"])
        folder.mkdir(parents=True, exist_ok=True)
        # A real (empty) wheel of that name and version, under the pinned file name (its platform tags).
        module = re.sub(r"[-.]", "_", pin["name"])
        built = wheelhouse.build_pure_wheel(dest / ".build", pin["name"], pin["version"],
                                            {"%s/__init__.py" % module: b'"""stand-in"""\n'}, [])
        built.replace(folder / pin["file"])
        sha = out["sha256"][pin["file"]] = wheelhouse._sha256(folder / pin["file"])
        if pin.get("layout") != "files":
            with open(folder / "index.html", "a") as index:  # PEP 503: one link per file, its sha256 after #
                index.write('<a href="%s#sha256=%s">%s</a>\n' % (pin["file"].replace("+", "%2B"), sha, pin["file"]))
    for name, repo in sorted((hv.get("pdctl_stage_apt") or {}).items()):
        folder = dest / repo["source"]
        folder.mkdir(parents=True, exist_ok=True)
        stanzas = []
        for item in repo.get("packages") or []:
            package, _, version = item.partition("=")
            deb = _standin_deb(folder, package, "%s-1" % (version or "1.0"))
            data = deb.read_bytes()
            stanzas.append("Package: %s\nVersion: %s-1\nArchitecture: all\nFilename: ./%s\nSize: %d\nSHA256: %s\n"
                           % (package, version or "1.0", deb.name, len(data), hashlib.sha256(data).hexdigest()))
        packages = "\n".join(stanzas)
        (folder / "Packages").write_text(packages)
        (folder / "Release").write_text("Origin: %s\nSuite: ./\nSHA256:\n %s %d Packages\n" % (
            STANDIN_KEY_NAME, hashlib.sha256(packages.encode()).hexdigest(), len(packages)))
        key_dir = dest / ".keys" / name
        apt_signing.sign(key_dir, folder)
        out["keys"][name] = key_dir / apt_signing.PUBLIC_ASC
    source = hv.get("pdctl_model_source", "")
    if source.startswith("hf://"):
        repo, rev = source[len("hf://"):].strip("/"), out["revision"]
        api = dest / "hub" / "api" / "models" / repo
        for sub in ("revision", "tree"):
            (api / sub).mkdir(parents=True, exist_ok=True)
        (api / "revision" / rev).write_text('{"sha": "%s"}' % rev)
        # Two files: weights (LFS: sha256) and a config (git blob id), as the Hub's tree lists them.
        files = {"model-00001-of-00001.safetensors": b"stand-in weights\n", "config.json": b"{}\n"}
        tree = []
        for path, body in files.items():
            target = dest / "hub" / repo / "resolve" / rev / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(body)
            entry = {"type": "file", "path": path, "size": len(body),
                     "oid": hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()}
            if path.endswith(".safetensors"):
                entry["lfs"] = {"oid": hashlib.sha256(body).hexdigest(), "size": len(body)}
            tree.append(entry)
        (api / "tree" / rev).write_text(json.dumps(tree))
    return out
