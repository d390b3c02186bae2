"""What `pdctl-lab up` stages on the controller for the lab hosts, besides the apt repository.

- secrets: the router API key, a Hub token and the front door's clients (the lab's stand-ins for
  Ansible Vault entries);
- TLS: a lab CA and a server certificate for the front-door hosts (.lab/tls, see pdctl.lab.tls);
- the synthetic model, served by a Hub API stub on the lab network (the real Hub client code runs);
- the wheelhouse: the engine stand-in built from this checkout as four releases (A, B, bad-sla,
  bad-accuracy; pdctl.lab.releases), NIXL and vllm-router, with deps, and a hash-pinned lock per
  venv (requirements-<set>.txt, see pdctl.wheelhouse): one per stand-in release
  (requirements-vllm-lab-<version>.txt), the deployed release's again under the vllm role's
  default name (requirements-vllm-<pdctl_versions.vllm>.txt), and the router's.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sys
import time
import tomllib
from pathlib import Path

from pdctl import collection, inventory, wheelhouse
from pdctl.lab import daemon, image, releases, store, tls

HUB_PORT = 8781
MODEL_SIZE_MB = 1024
ENGINE_DIST = "pdctl-lab-engine"


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


# -- secrets -----------------------------------------------------------------------------------

def ensure_secrets(lab_dir: Path) -> None:
    d = lab_dir / "secrets"
    d.mkdir(mode=0o700, exist_ok=True)
    for name, prefix in (("api-key", "lab-"), ("hf-token", "hf_lab")):
        path = d / name
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(prefix + secrets.token_urlsafe(24))
    # The front door's named clients (pdctl_frontdoor_clients); the lab inventory revokes `revoked`.
    path = d / "clients.yml"
    if not path.exists():
        clients = [{"name": name, "key": "lab-%s-%s" % (name, secrets.token_urlsafe(24))}
                   for name in ("gates", "tester", "revoked")]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(clients, fh)  # JSON is YAML: the inventory reads it with from_yaml


def client_key(lab_dir: Path, name: str = "tester") -> str:
    """A front-door client's key from the file ensure_secrets wrote (the benchmarks' and lab tests' client)."""
    return {c["name"]: c["key"] for c in json.loads((lab_dir / "secrets" / "clients.yml").read_text())}[name]


# -- model ---------------------------------------------------------------------------------------

def ensure_model(lab_dir: Path, bind: str) -> str:
    """Build the synthetic model once (cached by generator code), serve it as the Hub; return its revision."""
    from pdctl.lab import synthetic_model

    src = collection.root() / "src" / "pdctl" / "lab"
    key = _digest(src / "synthetic_model.py", src / "tokenizer.py")
    model_dir = image.cache_dir() / ("model-%dmb-%s" % (MODEL_SIZE_MB, key))
    info_file = model_dir / ".pdctl-build.json"
    if not info_file.exists():
        t0 = time.monotonic()
        shutil.rmtree(model_dir, ignore_errors=True)
        info = synthetic_model.build(str(model_dir), size_mb=MODEL_SIZE_MB)
        info_file.write_text(info["revision"])
        print("lab: built the synthetic model (%d MB, revision %s) in %.1fs"
              % (MODEL_SIZE_MB, info["revision"][:12], time.monotonic() - t0), flush=True)
    revision = info_file.read_text().strip()
    (lab_dir / "model-revision").write_text(revision)
    _link(lab_dir / "model", model_dir)  # the benchmark client's --tokenizer
    token_file = lab_dir / "secrets" / "hf-token"
    daemon.start(lab_dir, "hub", [sys.executable, "-m", "pdctl.lab.stage", "hub", str(model_dir), bind,
                                  str(HUB_PORT), str(token_file)],
                 "http://%s:%d/api/models/%s/revision/main" % (bind, HUB_PORT, synthetic_model.REPO_ID),
                 ok_codes=(401,))
    return revision


def _serve_hub(model_dir: str, bind: str, port: str, token_file: str) -> None:
    from pdctl.lab.synthetic_model import HubStub

    token = Path(token_file).read_text().strip()
    with HubStub(model_dir, token=token, host=bind, port=int(port)) as stub:
        print("Hub stub for %s at %s (revision %s)" % (stub.repo_id, stub.url, stub.revision), flush=True)
        stub._thread.join()


# -- wheels --------------------------------------------------------------------------------------

def _build_engine_wheel(dest: Path, identity: dict) -> Path:
    """One stand-in release as its own small distribution: the engine package, its identity
    (pdctl/lab/engine/_release.py, see pdctl.lab.releases) and its runtime deps only."""
    root = collection.root()
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    pins = {p.split("==")[0].lower(): p for p in project["dependencies"] + project["optional-dependencies"]["lab"]}
    # numpy is not the engine's: NIXL needs it on the lab hosts, where NIXL comes without deps.
    deps = [pins[name] for name in ("aiohttp", "tokenizers", "pyyaml", "jinja2", "numpy")]
    lab = root / "src" / "pdctl" / "lab"
    files = {"pdctl/__init__.py": b'"""pdctl-lab engine stand-in (lab hosts only)."""\n',
             "pdctl/lab/__init__.py": b"",
             "pdctl/lab/tokenizer.py": (lab / "tokenizer.py").read_bytes()}
    for path in sorted((lab / "engine").rglob("*.py")):
        files["pdctl/lab/engine/" + path.relative_to(lab / "engine").as_posix()] = path.read_bytes()
    files["pdctl/lab/engine/_release.py"] = releases.release_module(identity)
    return wheelhouse.build_pure_wheel(dest, ENGINE_DIST, identity["version"], files, deps,
                                       console_scripts={"pdctl-lab-engine": "pdctl.lab.engine.cli:main"})


def engine_locks(hv: dict) -> dict[str, tuple[list[str], list[str]]]:
    """{install set: (requirements, no-deps requirements)} of the engine venvs, from one host's vars.

    Every stand-in release gets set vllm-lab-<version> (a role picks release B with vllm_version
    "lab-<B's version>"); the deployed release (pdctl_lab_engine_version) is also set
    vllm-<pdctl_versions.vllm>, the name the vllm role's default vllm_version asks for.
    """
    engine = list(hv["pdctl_engine"]["packages"])
    no_deps = list(hv["pdctl_engine"].get("packages_no_deps") or [])
    others = [r for r in engine if not r.startswith(ENGINE_DIST)]
    locks = {"vllm-%s" % hv["pdctl_versions"]["vllm"]: (engine, no_deps)}
    for identity in releases.identities(hv["pdctl_lab_engine_releases"]).values():
        locks[releases.lock_set(identity["version"])] = (
            ["%s==%s" % (ENGINE_DIST, identity["version"])] + others, no_deps)
    return locks


def ensure_wheels(lab_dir: Path, inventory_dir: Path) -> None:
    hosts = inventory.load(inventory_dir, names=("pdctl_engine", "pdctl_versions", "pdctl_lab_engine_releases",
                                                 "pdctl_lab_engine_version"))
    hv = next(iter(hosts.values()))["vars"]
    engine = list(hv["pdctl_engine"]["packages"])
    router = ["vllm-router==%s" % hv["pdctl_versions"]["vllm_router"]]
    requirements = [r for r in engine if not r.startswith(ENGINE_DIST)] + router
    no_deps = list(hv["pdctl_engine"].get("packages_no_deps") or [])
    identities = releases.identities(hv["pdctl_lab_engine_releases"])
    deployed = [i for i in identities.values() if i["version"] == str(hv["pdctl_lab_engine_version"])]
    if not deployed:
        raise RuntimeError("pdctl_lab_engine_version %s is none of pdctl_lab_engine_releases %s"
                           % (hv["pdctl_lab_engine_version"], hv["pdctl_lab_engine_releases"]))
    # One hash-pinned lock per venv, named as the roles ask for it (vllm-<release>, router-<release>).
    locks = dict(engine_locks(hv), **{"router-%s" % hv["pdctl_versions"]["vllm_router"]: (router, [])})
    engine_src = sorted((collection.root() / "src/pdctl/lab/engine").rglob("*.py")) + [
        collection.root() / "src/pdctl/lab/tokenizer.py", collection.root() / "pyproject.toml", Path(wheelhouse.__file__)]
    # The key covers every input of the wheelhouse: the sets and their requirements, the engine's
    # source, and each release's identity exactly as its wheel carries it.
    identity_src = b"".join(releases.release_module(i) for _, i in sorted(identities.items()))
    key = hashlib.sha256(("\0".join(engine + requirements + no_deps + sorted(locks)
                                    + ["%s=%s" % (k, v) for k, v in sorted(locks.items())])
                          + _digest(*engine_src) + hashlib.sha256(identity_src).hexdigest()).encode()).hexdigest()[:12]
    cache = image.cache_dir() / ("wheels-" + key)
    if not (cache / ".complete").exists():
        t0 = time.monotonic()
        shutil.rmtree(cache, ignore_errors=True)
        built = {name: _build_engine_wheel(cache, identity) for name, identity in sorted(identities.items())}
        # The releases share their dependencies: the deployed one's wheel brings them in.
        wheelhouse.download([str(built[deployed[0]["name"]])] + requirements, cache)
        if no_deps:
            wheelhouse.download(no_deps, cache, no_deps=True)
        for name, (reqs, reqs_no_deps) in sorted(locks.items()):
            wheelhouse.write_lock(cache, name, reqs, reqs_no_deps)
        (cache / ".complete").write_text("\n".join(requirements) + "\n")
        print("lab: staged %d wheels in %.1fs" % (len(list(cache.glob("*.whl"))), time.monotonic() - t0), flush=True)
    target = lab_dir / "store" / "wheels"
    target.parent.mkdir(parents=True, exist_ok=True)  # staged before the store starts (pdctl-lab up)
    if not (target.is_symlink() and os.readlink(target) == str(cache)):
        if target.is_symlink():
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)
        target.symlink_to(cache)
    publish_locks(cache, lab_dir / "store" / wheelhouse.SIGNED_DIR, lab_dir / store.SIGNING_DIR)


def publish_locks(wheel_dir: Path, target: Path, key_dir: Path) -> None:
    """Every lock of wheel_dir clearsigned with this lab's key into target (store/locks/, what the
    hosts read; the cached wheelhouse is shared by checkouts with keys of their own)."""
    target.mkdir(exist_ok=True)
    wanted = set()
    for lock in sorted(wheel_dir.glob(wheelhouse.lock_name("*"))):
        wanted.add(wheelhouse.sign_lock(key_dir, lock, target).name)
    for old in target.glob(wheelhouse.signed_name("*")):
        if old.name not in wanted:
            old.unlink()


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.exists():
        shutil.rmtree(link)
    link.symlink_to(target)


# -- gates -----------------------------------------------------------------------------------------

# The stand-in's latency model for the lab (meets the SLA with room to spare at the lab's sizes) and
# its answers: the answer key below, right 90% of the time.
ENGINE_PROFILE = """\
latency:
  prefill_tokens_per_s: 200000
  prefill_overhead_ms: 20
  decode_step_ms: 30
  decode_step_ms_per_request: 0.05
  mtp_acceptance_rate: 0.8
  kv_bytes_per_token: 256
answers:
  key: /etc/pdctl/engine/answer-key.json
  mode: normal
"""


def ensure_gate_inputs(lab_dir: Path, inventory_dir: Path) -> None:
    """Synthetic data sets, the stand-in's answer key and profile, and the real vllm-rs client."""
    from ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates import answer_key
    from pdctl.lab import synthetic_datasets, tools

    datasets = lab_dir / "datasets"
    if not (datasets / ".complete").exists():
        synthetic_datasets.write(datasets)
        (datasets / ".complete").write_text("synthetic\n")
    hosts = inventory.load(inventory_dir, names=("pdctl_gate_accuracy",))
    config = next(iter(hosts.values()))["vars"]["pdctl_gate_accuracy"]
    engine = lab_dir / "engine"
    engine.mkdir(exist_ok=True)
    key = json.dumps(answer_key.build_from_config(config, correct_rate=0.9), sort_keys=True)
    for name, text in (("answer-key.json", key), ("profile.yml", ENGINE_PROFILE)):
        path = engine / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    (lab_dir / "tools").mkdir(exist_ok=True)
    _link(lab_dir / "tools" / "vllm-rs", Path(tools.ensure_vllm_rs()))


def stage_all(lab_dir: Path, inventory_dir: Path, bind: str) -> dict[str, float]:
    """Stage everything but the wheelhouse (`pdctl-lab up` stages it beside the image build:
    ensure_wheels); return the seconds each step took."""
    timings = {}
    for name, step in (("secrets", lambda: ensure_secrets(lab_dir)),
                       ("tls", lambda: tls.ensure(lab_dir, inventory_dir)),
                       ("model", lambda: ensure_model(lab_dir, bind)),
                       ("gate_inputs", lambda: ensure_gate_inputs(lab_dir, inventory_dir))):
        t0 = time.monotonic()
        step()
        timings[name] = time.monotonic() - t0
    return timings


def stop_all(lab_dir: Path) -> None:
    daemon.stop(lab_dir, "hub")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "hub":
        _serve_hub(*sys.argv[2:])
    else:
        sys.exit("usage: python -m pdctl.lab.stage hub MODEL_DIR BIND PORT TOKEN_FILE")
