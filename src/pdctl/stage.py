"""`pdctl stage -i INVENTORY [--check]`: every artifact a host installs, from its pinned upstream into the store.

Runs on the controller, the one machine that may reach the upstreams; the hosts read only the store
(docs/airgap.md). The inventory, over the collection's defaults layer (roles/pdctl_defaults), names each
upstream and pins each artifact:

- wheels: the engine's and the router's requirements (`pdctl_engine`, `pdctl_versions`) resolve on
  the package registry (`pdctl_stage_sources.pypi`), except those pinned file by file with a sha256 in
  `pdctl_stage_wheels`, which come from their own named source (FlashInfer's index per CUDA version
  and GPU architecture);
- apt packages: `pdctl_stage_apt`, per upstream repository, checked against that repository's own
  signing key (a file beside the inventory, never fetched);
- the model: `pdctl_model_source` at `pdctl_model_revision`, from `pdctl_stage_model_hub`.

`--check` resolves everything without downloading artifacts (registry metadata, repository indexes)
and prints one line per artifact: what, which version, from where, and whether it is obtainable.
Exit codes:

  0  every artifact is obtainable at its pin, or comes from an upstream this machine cannot reach
     and is fully pinned there (source and sha256 or signing key): "unreachable here"
  1  an artifact is not obtainable: its source does not have it, or has it with another sha256
  2  the inventory is invalid (nothing was looked up)
  3  nothing is known to be wrong, but a pin is missing (named: a sha256 or key to fill in)

Without --check (--store DIR --key-dir KEY_DIR): downloads every wheel into <store>/wheels (the
named-source files checked against their sha256), writes the install sets' locks and clearsigns them
with the store key into <store>/locks, where the hosts read them; mirrors the pinned apt packages from
their verified repositories into <store>/apt (each .deb checked against its signed index), indexed and
signed with the store key; copies the model's pinned revision into <store>/hub in the Hub's layout.

`--source NAME=URL` points a named source elsewhere (a mirror; CI's local stand-ins of the upstreams
this machine cannot reach) and `--key REPO=FILE` names the key its apt repository is signed with, so
the code path is the production one.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pdctl import wheelhouse

EXIT_OK, EXIT_MISSING, EXIT_INVALID, EXIT_UNPINNED = 0, 1, 2, 3
OK, UNREACHABLE, UNPINNED, MISSING = "ok", "unreachable here", "pin missing", "NOT OBTAINABLE"
NAMES = ("pdctl_versions", "pdctl_engine", "pdctl_stage_sources", "pdctl_stage_wheels", "pdctl_stage_apt",
         "pdctl_stage_host", "pdctl_model_source", "pdctl_model_revision", "pdctl_stage_model_hub")
PLACEHOLDER_REVISION = re.compile(r"^0*$")


class StageError(Exception):
    pass


class Unreachable(Exception):
    """The upstream did not answer (DNS, connection, TLS, timeout): not the same as "it has no such file"."""


@dataclass
class Row:
    kind: str
    name: str
    version: str
    source: str
    status: str
    detail: str = ""


# -- fetching ----------------------------------------------------------------------------------------

def _get(url: str, accept: str | None = None, timeout: float = 30) -> bytes:
    req = urllib.request.Request(url, headers={"User-Agent": "pdctl-stage", **({"Accept": accept} if accept else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - URLs from the inventory
            return resp.read()
    except urllib.error.HTTPError:
        raise
    except (urllib.error.URLError, OSError) as exc:
        raise Unreachable("%s: %s" % (url, getattr(exc, "reason", exc))) from exc


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def index_files(index: str, project: str) -> dict[str, str]:
    """{filename: sha256} a PEP 503/691 simple index lists for project (sha256 '' where it gives none)."""
    url = index.rstrip("/") + "/" + _canonical(project) + "/"
    body = _get(url, accept="application/vnd.pypi.simple.v1+json, text/html;q=0.1")
    text = body.decode(errors="replace")
    if text.lstrip().startswith("{"):
        return {f["filename"]: f.get("hashes", {}).get("sha256", "") for f in json.loads(text)["files"]}
    files = {}
    for href in re.findall(r'href=["\']([^"\']+)["\']', text):
        path, _, fragment = href.partition("#")
        name = urllib.request.url2pathname(path.rsplit("/", 1)[-1])
        files[urllib.parse.unquote(name)] = fragment.split("=", 1)[1] if fragment.startswith("sha256=") else ""
    return files


# -- the inventory -----------------------------------------------------------------------------------

def load(inventory_dir: Path, overrides: dict[str, str], keys: dict[str, str] | None = None) -> dict:
    from pdctl import inventory

    try:
        hosts = inventory.load(inventory_dir, names=NAMES)
    except inventory.InventoryError as exc:
        raise StageError(str(exc)) from exc
    hv = json.loads(json.dumps(next(iter(hosts.values()))["vars"]))  # plain data, not Ansible's tagged strings
    missing = [n for n in ("pdctl_versions", "pdctl_engine", "pdctl_stage_sources") if n not in hv]
    if missing:
        raise StageError("%s does not define %s (neither its group_vars/all nor the defaults layer)"
                         % (inventory_dir, ", ".join(missing)))
    sources = dict(hv["pdctl_stage_sources"])
    for name, url in overrides.items():
        if name not in sources:
            raise StageError("--source %s: no such source (pdctl_stage_sources has %s)" % (name, ", ".join(sorted(sources))))
        sources[name] = url
    hv["pdctl_stage_sources"] = sources
    for pin in hv.get("pdctl_stage_wheels") or []:
        if pin.get("source") not in sources:
            raise StageError("pdctl_stage_wheels: %s names source %r, which pdctl_stage_sources lacks"
                             % (pin.get("name"), pin.get("source")))
    for name, repo in (hv.get("pdctl_stage_apt") or {}).items():
        if repo.get("source") not in sources:
            raise StageError("pdctl_stage_apt.%s names source %r, which pdctl_stage_sources lacks" % (name, repo.get("source")))
    apt = {name: dict(repo) for name, repo in (hv.get("pdctl_stage_apt") or {}).items()}
    for name, path in (keys or {}).items():
        if name not in apt:
            raise StageError("--key %s: no such repository (pdctl_stage_apt has %s)" % (name, ", ".join(sorted(apt))))
        apt[name]["key"] = str(Path(path).resolve())
    hv["pdctl_stage_apt"] = apt
    hv["_inventory_dir"] = Path(inventory_dir)
    return hv


def _requirement_name(req: str) -> str:
    return _canonical(re.split(r"[=<>!~;\[ ]", req, maxsplit=1)[0])


def registry_requirements(hv: dict) -> tuple[list[str], list[str]]:
    """(with deps, without deps) requirements resolved on the registry: the engine's and the router's,
    less those pinned file by file from another source."""
    pinned = {_canonical(p["name"]) for p in hv.get("pdctl_stage_wheels") or []}
    engine = hv["pdctl_engine"]
    reqs = [r for r in engine["packages"] if _requirement_name(r) not in pinned]
    reqs.append("vllm-router==%s" % hv["pdctl_versions"]["vllm_router"])
    no_deps = [r for r in engine.get("packages_no_deps") or [] if _requirement_name(r) not in pinned]
    return reqs, no_deps


def _pip_target(hv: dict) -> list[str]:
    host = hv.get("pdctl_stage_host") or {}
    python, glibc, arch = str(host.get("python", "3.12")), str(host.get("glibc", "2.39")), host.get("arch", "x86_64")
    minor = int(glibc.split(".")[1])
    # pip takes the target's platform tags as given: every manylinux tag a glibc of this version runs.
    platforms = ["manylinux_2_%d_%s" % (v, arch) for v in range(minor, 4, -1)]
    platforms += ["manylinux2014_%s" % arch, "manylinux2010_%s" % arch, "manylinux1_%s" % arch, "linux_%s" % arch]
    args = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for p in platforms:
        args += ["--platform", p]
    return args


def _pip_env() -> dict:
    # Only the inventory's index counts: none of this machine's pip configuration (indexes, constraints).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def resolve_registry(hv: dict, requirements: list[str], no_deps: bool) -> list[dict]:
    """What pip installs for the requirements from the registry, for the hosts' Python and platform,
    from the registry's metadata only (no wheel is downloaded): [{name, version, url, sha256}]."""
    if not requirements:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--disable-pip-version-check", "--report", str(report),
               "--index-url", hv["pdctl_stage_sources"]["pypi"], *_pip_target(hv)]
        if no_deps:
            cmd.append("--no-deps")
        res = subprocess.run(cmd + requirements, capture_output=True, text=True, env=_pip_env())
        if res.returncode != 0:
            err = res.stderr.strip()
            if re.search(r"NewConnectionError|Max retries exceeded|Failed to establish|Name or service not known", err):
                raise Unreachable(err.splitlines()[-1])
            raise StageError("\n".join(line for line in err.splitlines() if line.startswith("ERROR"))[-2000:] or err[-2000:])
        items = json.loads(report.read_text())["install"]
    return [{"name": _canonical(i["metadata"]["name"]), "version": i["metadata"]["version"],
             "url": i["download_info"]["url"],
             "sha256": (i["download_info"].get("archive_info", {}).get("hashes") or {}).get("sha256", "")}
            for i in items]


# -- checks --------------------------------------------------------------------------------------------

def check_wheels(hv: dict) -> list[Row]:
    rows = []
    pypi = hv["pdctl_stage_sources"]["pypi"]
    reqs, no_deps = registry_requirements(hv)
    seen = set()
    for group, flag in ((reqs, False), (no_deps, True)):
        try:
            resolved = resolve_registry(hv, group, flag)
        except Unreachable as exc:
            rows += [Row("wheel", r, "", pypi, UNREACHABLE, str(exc)) for r in group]
            continue
        except StageError as exc:
            rows += [Row("wheel", " ".join(group), "", pypi, MISSING, str(exc))]
            continue
        for item in resolved:
            if (item["name"], item["version"]) in seen:
                continue
            seen.add((item["name"], item["version"]))
            rows.append(Row("wheel", item["name"], item["version"], "pypi", OK,
                            "sha256 %s  %s" % (item["sha256"], item["url"].rsplit("/", 1)[-1])))
    for pin in hv.get("pdctl_stage_wheels") or []:
        rows.append(check_pinned_wheel(hv, pin))
    return rows


def pinned_url(hv: dict, pin: dict) -> str:
    """Where a pinned wheel is downloaded: <index>/<project>/<file> (a simple index) or <base>/<file>
    (layout files: a release's download directory)."""
    base = hv["pdctl_stage_sources"][pin["source"]].rstrip("/") + "/"
    return base + ("" if pin.get("layout") == "files" else _canonical(pin["name"]) + "/") + urllib.parse.quote(pin["file"])


def check_pinned_wheel(hv: dict, pin: dict) -> Row:
    index = hv["pdctl_stage_sources"][pin["source"]]
    name, version, sha = pin["name"], str(pin["version"]), pin.get("sha256") or ""
    where = "%s (%s) %s" % (pin["source"], index, pin["file"])
    if pin.get("layout") == "files":
        # A download directory lists nothing: the file is asked for (HEAD), its sha256 is checked when staged.
        try:
            req = urllib.request.Request(pinned_url(hv, pin), method="HEAD", headers={"User-Agent": "pdctl-stage"})
            urllib.request.urlopen(req, timeout=30).close()  # noqa: S310 - URL from the inventory
        except urllib.error.HTTPError as exc:
            return Row("wheel", name, version, where, MISSING, "HTTP %d for the file" % exc.code)
        except (urllib.error.URLError, OSError) as exc:
            return Row("wheel", name, version, where, UNPINNED if not sha else UNREACHABLE,
                       ("pinned sha256 %s" % sha if sha else "no sha256 in the inventory") + "; %s" % getattr(exc, "reason", exc))
        if not sha:
            return Row("wheel", name, version, where, UNPINNED, "the file is there; no sha256 in the inventory")
        return Row("wheel", name, version, where, OK, "pinned sha256 %s (checked when staged)" % sha)
    try:
        listed = index_files(index, name)
    except Unreachable as exc:
        if not sha:
            return Row("wheel", name, version, where, UNPINNED, "no sha256 in the inventory; and %s" % exc)
        return Row("wheel", name, version, where, UNREACHABLE, "pinned sha256 %s" % sha)
    except urllib.error.HTTPError as exc:
        return Row("wheel", name, version, where, MISSING, "the index has no project %s (HTTP %d)" % (name, exc.code))
    if pin["file"] not in listed:
        return Row("wheel", name, version, where, MISSING, "the index does not list %s" % pin["file"])
    if not sha:
        return Row("wheel", name, version, where, UNPINNED,
                   "no sha256 in the inventory; the index says %s (review, then pin it)" % (listed[pin["file"]] or "nothing"))
    if listed[pin["file"]] and listed[pin["file"]] != sha:
        return Row("wheel", name, version, where, MISSING,
                   "the index says sha256 %s, the pin %s" % (listed[pin["file"]], sha))
    return Row("wheel", name, version, where, OK, "sha256 %s" % sha)


def _release_index(text: str) -> dict[str, str]:
    """{path: sha256} of a Release/InRelease file's SHA256 section."""
    out, on = {}, False
    for line in text.splitlines():
        if not line.startswith(" "):
            on = line.startswith("SHA256:")
            continue
        if on:
            parts = line.split()
            if len(parts) == 3:
                out[parts[2]] = parts[0]
    return out


def _packages(text: str) -> list[dict]:
    stanzas, cur, key = [], {}, None
    for line in text.splitlines() + [""]:
        if not line.strip():
            if cur:
                stanzas.append(cur)
            cur, key = {}, None
        elif line[0] in " \t" and key:
            cur[key] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            cur[key] = value.strip()
    return stanzas


def _keyring(key_file: Path, tmp: Path) -> Path:
    """The armored key as a binary keyring gpgv reads."""
    out = tmp / (key_file.name + ".gpg")
    # A GnuPG home of its own (the temporary directory): nothing of the operator's is read or written.
    subprocess.run(["gpg", "--homedir", str(tmp), "--batch", "--yes", "--dearmor", "--output", str(out), str(key_file)],
                   check=True, capture_output=True)
    return out


def fetch_apt_index(uri: str, key_file: Path) -> list[dict]:
    """The package stanzas of a flat repository (suite "/") whose InRelease verifies with key_file."""
    base = uri.rstrip("/") + "/"
    inrelease = _get(base + "InRelease")
    with tempfile.TemporaryDirectory() as tmp:
        signed = Path(tmp) / "InRelease"
        signed.write_bytes(inrelease)
        res = subprocess.run(["gpgv", "--keyring", str(_keyring(key_file, Path(tmp))), "--output", "-", str(signed)],
                             capture_output=True)
        if res.returncode != 0:
            raise StageError("%sInRelease does not verify with %s: %s" % (base, key_file, res.stderr.decode()[-300:]))
    hashes = _release_index(res.stdout.decode())
    for name, unpack in (("Packages.gz", gzip.decompress), ("Packages", lambda b: b)):
        if name in hashes:
            data = _get(base + name)
            if hashlib.sha256(data).hexdigest() != hashes[name]:
                raise StageError("%s%s does not match the sha256 its signed InRelease gives" % (base, name))
            return _packages(unpack(data).decode(errors="replace"))
    raise StageError("%sInRelease lists no Packages index" % base)


def _pick(stanzas: list[dict], package: str, version: str) -> dict | None:
    found = [s for s in stanzas if s.get("Package") == package and
             (not version or s.get("Version", "") == version or s.get("Version", "").startswith(version + "-"))]
    return found[-1] if found else None


def check_apt(hv: dict) -> list[Row]:
    rows = []
    for name, repo in sorted((hv.get("pdctl_stage_apt") or {}).items()):
        uri = hv["pdctl_stage_sources"][repo["source"]]
        key = hv["_inventory_dir"] / repo["key"] if repo.get("key") else None
        where = "%s (%s)" % (repo["source"], uri)
        packages = [(p.split("=", 1) + [""])[:2] for p in repo.get("packages") or []]
        if key is None or not key.exists():
            why = "signing key file %s is not there" % (key or "(none named)")
            rows += [Row("deb", p, v, where, UNPINNED, why) for p, v in packages]
            continue
        try:
            stanzas = fetch_apt_index(uri, key)
        except Unreachable as exc:
            rows += [Row("deb", p, v, where, UNREACHABLE, "signed repository, key %s (%s)" % (repo["key"], exc))
                     for p, v in packages]
            continue
        except (StageError, urllib.error.HTTPError) as exc:
            rows += [Row("deb", p, v, where, MISSING, str(exc)) for p, v in packages]
            continue
        for p, v in packages:
            found = _pick(stanzas, p, v)
            rows.append(Row("deb", p, v, where, OK, "%s sha256 %s (signed index)" % (found["Version"], found.get("SHA256", "")))
                        if found else Row("deb", p, v, where, MISSING, "the repository has no %s %s" % (p, v or "")))
    return rows


def check_model(hv: dict) -> list[Row]:
    source, revision = hv.get("pdctl_model_source", ""), str(hv.get("pdctl_model_revision", ""))
    hub = hv.get("pdctl_stage_model_hub") or ""
    if not source.startswith("hf://") or not hub:
        return []
    repo = source[len("hf://"):].strip("/")
    where = "hub (%s) %s" % (hub, repo)
    if PLACEHOLDER_REVISION.match(revision):
        try:  # what the Hub's main branch is now: a commit to review, never taken as the pin
            now = json.loads(_get("%s/api/models/%s/revision/main" % (hub.rstrip("/"), repo))).get("sha")
            seen = "the Hub's main is %s now (review, then pin it)" % now
        except (Unreachable, urllib.error.HTTPError, ValueError) as exc:
            seen = "and the Hub cannot be asked from here (%s)" % exc
        return [Row("model", repo, revision or "(none)", where, UNPINNED,
                    "pdctl_versions.model_revision is the all-zero placeholder: pin the Hub commit; " + seen)]
    try:
        data = json.loads(_get("%s/api/models/%s/revision/%s" % (hub.rstrip("/"), repo, revision)))
    except Unreachable as exc:
        return [Row("model", repo, revision, where, UNREACHABLE, "pinned revision; every file's sha256 comes "
                    "from the Hub's tree at that commit (%s)" % exc)]
    except urllib.error.HTTPError as exc:
        return [Row("model", repo, revision, where, MISSING, "the Hub answered HTTP %d for that revision" % exc.code)]
    return [Row("model", repo, revision, where, OK if data.get("sha") == revision else MISSING,
                "the Hub resolves it to %s" % data.get("sha"))]


def check(hv: dict) -> list[Row]:
    return check_wheels(hv) + check_apt(hv) + check_model(hv)


def exit_code(rows: list[Row]) -> int:
    statuses = {r.status for r in rows}
    if MISSING in statuses:
        return EXIT_MISSING
    if UNPINNED in statuses:
        return EXIT_UNPINNED
    return EXIT_OK


def print_rows(rows: list[Row], out=None) -> None:
    out = out or sys.stdout
    for r in rows:
        print("%-16s %-5s %-34s %-22s %s  %s" % (r.status, r.kind, r.name, r.version or "-", r.source, r.detail), file=out)
    counts = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    print("%d artifacts: %s" % (len(rows), ", ".join("%d %s" % (n, s) for s, n in sorted(counts.items()))), file=out)


# -- staging -------------------------------------------------------------------------------------------

def stage_wheels(hv: dict, store: Path, key_dir: Path) -> list[Path]:
    """Download every wheel into store/wheels (pinned files checked against their sha256), write the
    engine's and the router's locks, clearsign them into store/locks; return the signed locks."""
    import hashlib

    wheels = store / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for pin in hv.get("pdctl_stage_wheels") or []:
        if not pin.get("sha256"):
            raise StageError("%s %s has no sha256 pin (pdctl_stage_wheels): pin it before staging" % (pin["name"], pin["version"]))
        target = wheels / pin["file"]
        if not (target.exists() and wheelhouse._sha256(target) == pin["sha256"]):
            url = pinned_url(hv, pin)
            data = _get(url, timeout=600)
            if hashlib.sha256(data).hexdigest() != pin["sha256"]:
                raise StageError("%s: sha256 %s, the pin says %s" % (url, hashlib.sha256(data).hexdigest(), pin["sha256"]))
            target.write_bytes(data)
    # The registry's part (the pinned files are in the wheelhouse already, found by --find-links).
    reqs, no_deps = registry_requirements(hv)
    router = "vllm-router==%s" % hv["pdctl_versions"]["vllm_router"]
    target = _pip_target(hv)
    for group, flag in ((reqs, False), (no_deps, True)):
        if group:
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(wheels), "--find-links", str(wheels),
                   "--index-url", hv["pdctl_stage_sources"]["pypi"], *target] + (["--no-deps"] if flag else [])
            res = subprocess.run(cmd + group, capture_output=True, text=True, env=_pip_env())
            if res.returncode != 0:
                raise StageError("pip download failed: %s" % res.stderr.strip()[-2000:])
    host = hv.get("pdctl_stage_host") or {}
    platforms = tuple(a for a in target if a.startswith(("manylinux", "linux")))
    engine = hv["pdctl_engine"]
    locks = {"vllm-%s" % hv["pdctl_versions"]["vllm"]: (list(engine["packages"]), list(engine.get("packages_no_deps") or [])),
             "router-%s" % hv["pdctl_versions"]["vllm_router"]: ([router], [])}
    signed = []
    for name, (with_deps, without) in sorted(locks.items()):
        lock = wheelhouse.write_lock(wheels, name, with_deps, without, str(host.get("python", "3.12")), platforms)
        signed.append(wheelhouse.sign_lock(key_dir, lock, store / wheelhouse.SIGNED_DIR))
    return signed


def _download(url: str, target: Path, sha256: str) -> None:
    """url into target, refused unless its sha256 is the one given (kept if already there and right)."""
    if target.exists() and wheelhouse._sha256(target) == sha256:
        return
    tmp = target.with_name(target.name + ".part")
    h = hashlib.sha256()
    req = urllib.request.Request(url, headers={"User-Agent": "pdctl-stage"})
    with urllib.request.urlopen(req, timeout=600) as resp, open(tmp, "wb") as out:  # noqa: S310 - pinned source
        for chunk in iter(lambda: resp.read(1 << 20), b""):
            h.update(chunk)
            out.write(chunk)
    if h.hexdigest() != sha256:
        tmp.unlink()
        raise StageError("%s: sha256 %s, expected %s" % (url, h.hexdigest(), sha256))
    tmp.replace(target)


def stage_apt(hv: dict, store: Path, key_dir: Path) -> Path:
    """Every pinned package from its verified upstream repository into the store's flat repository
    (each .deb checked against the sha256 of its signed index), indexed and signed with the store key."""
    from pdctl import apt_signing

    apt = store / "apt"
    apt.mkdir(parents=True, exist_ok=True)
    for name, repo in sorted((hv.get("pdctl_stage_apt") or {}).items()):
        key = hv["_inventory_dir"] / repo["key"] if repo.get("key") else None
        if key is None or not key.exists():
            raise StageError("pdctl_stage_apt.%s: key file %s is not there" % (name, key))
        uri = hv["pdctl_stage_sources"][repo["source"]].rstrip("/") + "/"
        stanzas = fetch_apt_index(uri, key)
        for item in repo.get("packages") or []:
            package, _, version = item.partition("=")
            found = _pick(stanzas, package, version)
            if not found:
                raise StageError("%s has no %s" % (uri, item))
            filename = found["Filename"]
            _download(uri + filename.lstrip("./") if filename.startswith("./") else uri + filename,
                      apt / Path(filename).name, found["SHA256"])
    with open(apt / "Packages", "w") as out:
        subprocess.run(["apt-ftparchive", "packages", "."], cwd=apt, check=True, stdout=out)
    release = subprocess.run(["apt-ftparchive", "release", "."], cwd=apt, check=True, capture_output=True, text=True).stdout
    if not (apt / "Release").exists() or (apt / "Release").read_text() != release:
        (apt / "Release").write_text(release)
    apt_signing.sign(key_dir, apt)
    return apt


def stage_model(hv: dict, store: Path, token: str | None = None) -> Path:
    """The pinned revision from the Hub into <store>/hub in the Hub's own layout (revision, tree, resolve),
    every LFS file checked against its sha256, so the hosts' Hub client reads the store as it would the Hub."""
    source, revision = hv.get("pdctl_model_source", ""), str(hv.get("pdctl_model_revision", ""))
    if PLACEHOLDER_REVISION.match(revision):
        raise StageError("pdctl_versions.model_revision is the all-zero placeholder: pin the Hub commit first")
    repo = source[len("hf://"):].strip("/")
    hub = hv["pdctl_stage_model_hub"].rstrip("/")
    headers = {"Authorization": "Bearer %s" % token} if token else {}

    def get(url):
        req = urllib.request.Request(url, headers={"User-Agent": "pdctl-stage", **headers})
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - the pinned Hub
            return resp.read()

    data = json.loads(get("%s/api/models/%s/revision/%s" % (hub, repo, revision)))
    if data.get("sha") != revision:
        raise StageError("the Hub resolves %s to %s" % (revision, data.get("sha")))
    entries = json.loads(get("%s/api/models/%s/tree/%s?recursive=true" % (hub, repo, revision)))
    root = store / "hub"
    for rel, body in (("api/models/%s/revision/%s" % (repo, revision), json.dumps({"sha": revision})),
                      ("api/models/%s/tree/%s" % (repo, revision), json.dumps(entries))):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(body)
    for e in entries:
        if e.get("type") != "file":
            continue
        target = root / repo / "resolve" / revision / e["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        url = "%s/%s/resolve/%s/%s" % (hub, repo, revision, urllib.parse.quote(e["path"]))
        if e.get("lfs"):
            _download(url, target, e["lfs"]["oid"])
        else:
            body = get(url)
            if hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest() != e["oid"]:
                raise StageError("%s: git blob id differs from the tree's" % url)
            target.write_bytes(body)
    return root


# -- command -------------------------------------------------------------------------------------------

def _overrides(values: list[str], option: str = "--source") -> dict[str, str]:
    out = {}
    for v in values:
        name, sep, url = v.partition("=")
        if not sep or not url:
            raise StageError("%s %r: give NAME=VALUE" % (option, v))
        out[name] = url
    return out


def main(args) -> int:
    try:
        hv = load(Path(args.inventory), _overrides(args.source), _overrides(args.key, "--key"))
    except StageError as exc:
        print("pdctl stage: %s" % exc, file=sys.stderr)
        return EXIT_INVALID
    if args.check:
        rows = check(hv)
        print_rows(rows)
        code = exit_code(rows)
        if code != EXIT_OK:
            bad = [r for r in rows if r.status in (MISSING, UNPINNED)]
            print("pdctl stage: %s: %s" % ("not obtainable" if code == EXIT_MISSING else "pins missing",
                                           ", ".join(sorted({"%s %s" % (r.name, r.version) for r in bad}))), file=sys.stderr)
        return code
    if not args.store or not args.key_dir:
        print("pdctl stage: staging needs --store DIR and --key-dir DIR (the store's signing key)", file=sys.stderr)
        return EXIT_INVALID
    store, key_dir = Path(args.store), Path(args.key_dir)
    # Every pin first, before gigabytes are downloaded.
    unpinned = ["%s %s (sha256)" % (p["name"], p["version"]) for p in hv.get("pdctl_stage_wheels") or [] if not p.get("sha256")]
    unpinned += ["pdctl_stage_apt.%s (key file %s)" % (n, r.get("key")) for n, r in sorted((hv.get("pdctl_stage_apt") or {}).items())
                 if not r.get("key") or not (hv["_inventory_dir"] / r["key"]).exists()]
    if PLACEHOLDER_REVISION.match(str(hv.get("pdctl_model_revision", ""))):
        unpinned.append("pdctl_versions.model_revision (the all-zero placeholder)")
    if unpinned:
        print("pdctl stage: pins missing, nothing staged: %s (pdctl stage --check shows what the sources list)"
              % ", ".join(unpinned), file=sys.stderr)
        return EXIT_UNPINNED
    try:
        for path in stage_wheels(hv, store, key_dir):
            print("signed %s" % path)
        print("signed %s" % stage_apt(hv, store, key_dir))
        print("staged %s" % stage_model(hv, store, os.environ.get("HF_TOKEN")))
    except (StageError, Unreachable, urllib.error.URLError, subprocess.CalledProcessError) as exc:
        print("pdctl stage: %s" % exc, file=sys.stderr)
        return EXIT_MISSING
    return EXIT_OK


def add_parser(sub):
    p = sub.add_parser("stage", help="resolve (--check) or fetch every host artifact from its pinned upstream into the store",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-i", "--inventory", required=True)
    p.add_argument("--check", action="store_true", help="resolve only: print each artifact's source and status")
    p.add_argument("--source", action="append", default=[], metavar="NAME=URL",
                   help="point a named source (pdctl_stage_sources) elsewhere: a mirror, or CI's stand-in")
    p.add_argument("--key", action="append", default=[], metavar="REPO=FILE",
                   help="verify apt repository REPO (pdctl_stage_apt) with this key file instead (a stand-in's)")
    p.add_argument("--store", help="the artifact store's directory (staging)")
    p.add_argument("--key-dir", help="the store's signing key (python -m pdctl.apt_signing key KEY_DIR)")
    p.set_defaults(func=main)
