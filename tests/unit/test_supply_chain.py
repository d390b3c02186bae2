"""Supply chain (issue 14): the store's apt repository is signed and verified as apt does; every venv
installs from a lock that pins each wheel with its sha256; preflight refuses what would bypass either."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

import requires
from inventories import ROOT, group_var
from pdctl import apt_signing, inventory, wheelhouse
from test_role_tasks import run_role_tasks


@pytest.fixture
def gpg():
    requires.binary("gpg", "the store's apt repository is signed with gpg (package gpg)")
    requires.binary("gpgv", "apt verifies signatures with gpgv (package gpgv)")


def _repo(path: Path, packages: str = "Package: demo\nVersion: 1.0\n") -> Path:
    path.mkdir(parents=True)
    (path / "Packages").write_text(packages)
    (path / "Release").write_text("Date: Mon, 30 Nov 2026 00:00:00 UTC\nSHA256:\n %s %d Packages\n" % (
        wheelhouse._sha256(path / "Packages"), len(packages)))
    return path


def _apt_update(tmp_path: Path, repo: Path, keyring: Path) -> subprocess.CompletedProcess:
    """`apt-get update` of one file: source with Signed-By, in a state directory of its own."""
    state = tmp_path / ("apt-state-%d" % len(list(tmp_path.glob("apt-state-*"))))
    for sub in ("lists/partial", "cache/archives/partial"):
        (state / sub).mkdir(parents=True)
    (state / "test.list").write_text("deb [signed-by=%s] file:%s ./\n" % (keyring, repo))
    opts = ["-o", "Dir::Etc::SourceList=%s" % (state / "test.list"), "-o", "Dir::Etc::SourceParts=/nonexistent",
            "-o", "Dir::State::Lists=%s" % (state / "lists"), "-o", "Dir::Cache=%s" % (state / "cache"),
            "-o", "APT::Sandbox::User=root", "-o", "Debug::NoLocking=1"]
    return subprocess.run(["apt-get", "update", *opts], capture_output=True, text=True)


# ---------------------------------------------------------------- apt: signing and verification

def test_signed_repository_verifies_and_a_tampered_release_does_not(tmp_path, gpg):
    key_dir, repo = tmp_path / "key", _repo(tmp_path / "repo")
    assert apt_signing.sign(key_dir, repo) is True
    fpr = apt_signing.fingerprint(key_dir)
    assert (key_dir / "pdctl-store.asc").read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    assert oct((key_dir / "gnupg").stat().st_mode & 0o777) == "0o700"
    assert apt_signing.verify(repo, key_dir / apt_signing.PUBLIC_GPG)
    clear = subprocess.run(["gpgv", "--keyring", str(key_dir / apt_signing.PUBLIC_GPG), "--output", "-",
                            str(repo / "InRelease")], capture_output=True, text=True)
    assert clear.returncode == 0 and clear.stdout == (repo / "Release").read_text()
    # Nothing changed: the signatures stay, the key is the one made first.
    inrelease = (repo / "InRelease").read_bytes()
    assert apt_signing.sign(key_dir, repo) is False
    assert (repo / "InRelease").read_bytes() == inrelease and apt_signing.fingerprint(key_dir) == fpr

    # One hash in Release (and in InRelease's signed text) changed: neither signature holds.
    for name in ("Release", "InRelease"):
        text = (repo / name).read_text()
        (repo / name).write_text(re.sub(r" [0-9a-f]{64} ", " " + "0" * 64 + " ", text, count=1))
    assert not apt_signing.verify(repo, key_dir / apt_signing.PUBLIC_GPG)
    for args in (["--keyring", str(key_dir / apt_signing.PUBLIC_GPG), str(repo / "InRelease")],
                 ["--keyring", str(key_dir / apt_signing.PUBLIC_GPG), str(repo / "Release.gpg"), str(repo / "Release")]):
        res = subprocess.run(["gpgv", *args], capture_output=True, text=True)
        assert res.returncode != 0 and "BAD signature" in res.stderr, res.stderr
    # Signing again repairs it.
    assert apt_signing.sign(key_dir, repo) is True and apt_signing.verify(repo, key_dir / apt_signing.PUBLIC_GPG)


def test_a_key_from_another_store_does_not_verify(tmp_path, gpg):
    repo = _repo(tmp_path / "repo")
    apt_signing.sign(tmp_path / "ours", repo)
    apt_signing.ensure_key(tmp_path / "theirs")
    assert not apt_signing.verify(repo, tmp_path / "theirs" / apt_signing.PUBLIC_GPG)


def _sign_repos_and_locks(key_dir: str, work: str, worker: int) -> None:
    base = Path(work) / ("w%d" % worker)
    for n in range(12):
        repo = _repo(base / ("repo%d" % n), "Package: demo\nVersion: %d.%d\n" % (worker, n))
        lock = base / ("lock%d.txt" % n)
        lock.write_text("demo==%d.%d --hash=sha256:%s\n" % (worker, n, "0" * 64))
        apt_signing.sign(Path(key_dir), repo)
        wheelhouse.sign_lock(Path(key_dir), lock)


def test_signers_at_once_on_one_key_do_not_stop_each_others_agent(tmp_path, gpg):
    """`pdctl-lab up` signs the apt repository while the wheelhouse stager signs its locks with the
    same key: each signing session starts and stops gpg-agent, so one may not stop it under another."""
    import multiprocessing

    key_dir = tmp_path / "key"
    apt_signing.ensure_key(key_dir)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_sign_repos_and_locks, args=(str(key_dir), str(tmp_path), i)) for i in range(6)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    assert [proc.exitcode for proc in procs] == [0] * 6
    for repo in tmp_path.glob("w*/repo*"):
        assert apt_signing.verify(repo, key_dir / apt_signing.PUBLIC_GPG)


def test_a_dropped_agent_connection_is_retried_once_and_other_errors_are_not(tmp_path, gpg, monkeypatch):
    key_dir, repo = tmp_path / "key", _repo(tmp_path / "repo")
    real, calls = apt_signing._gpg, []

    def flaky(kd, *args, **kw):
        if "--local-user" in args:
            calls.append(args)
            if len(calls) == 1:
                raise apt_signing.SigningError("gpg --local-user failed (exit 2): gpg: keydb_search failed: End of file")
        return real(kd, *args, **kw)

    monkeypatch.setattr(apt_signing, "_gpg", flaky)
    assert apt_signing.sign(key_dir, repo) is True and len(calls) == 3  # InRelease twice, Release.gpg once

    def broken(kd, *args, **kw):
        if "--local-user" in args:
            raise apt_signing.SigningError("gpg --local-user failed (exit 2): gpg: signing failed: No secret key")
        return real(kd, *args, **kw)

    monkeypatch.setattr(apt_signing, "_gpg", broken)
    (repo / "InRelease").unlink()
    with pytest.raises(apt_signing.SigningError, match="No secret key"):
        apt_signing.sign(key_dir, repo)


def test_apt_accepts_the_signed_repository_and_refuses_a_tampered_release(tmp_path, gpg):
    requires.binary("apt-get", "apt itself verifies the repository here (Debian/Ubuntu controller)")
    if os.geteuid() != 0:
        requires.missing("root", "apt-get update with a private state directory runs as root")
    key_dir, repo = tmp_path / "key", _repo(tmp_path / "repo")
    apt_signing.sign(key_dir, repo)
    good = _apt_update(tmp_path, repo, key_dir / apt_signing.PUBLIC_ASC)
    assert good.returncode == 0, good.stdout + good.stderr
    release = (repo / "InRelease").read_text().replace("Date: Mon, 30 Nov 2026", "Date: Tue, 01 Dec 2026")
    (repo / "InRelease").write_text(release)
    bad = _apt_update(tmp_path, repo, key_dir / apt_signing.PUBLIC_ASC)
    assert bad.returncode != 0
    assert "BADSIG" in bad.stdout + bad.stderr and "is not signed" in bad.stderr, bad.stdout + bad.stderr


def test_lab_store_publishes_the_cached_repository_signed_with_the_lab_key(tmp_path, gpg):
    from pdctl.lab import store

    staged = _repo(tmp_path / "cache" / "apt-x")
    (staged / "demo_1.0_all.deb").write_bytes(b"deb")
    key_dir, target = tmp_path / "lab" / "apt-signing", tmp_path / "lab" / "store" / "apt"
    target.parent.mkdir(parents=True)
    target.symlink_to(staged)  # the unsigned layout of earlier checkouts
    store.publish_apt(staged, target, key_dir)
    assert target.is_dir() and not target.is_symlink()
    assert os.readlink(target / "demo_1.0_all.deb") == str(staged / "demo_1.0_all.deb")
    assert not (staged / "InRelease").exists(), "the shared cache must stay unsigned (one key per lab)"
    assert apt_signing.verify(target, key_dir / apt_signing.PUBLIC_GPG)
    # The index is rebuilt: the published Release follows and is signed again; gone packages go.
    (staged / "demo_1.0_all.deb").unlink()
    (staged / "Packages").write_text("")
    (staged / "Release").write_text("Date: Tue, 01 Dec 2026 00:00:00 UTC\n")
    store.publish_apt(staged, target, key_dir)
    assert (target / "Release").read_text() == (staged / "Release").read_text()
    assert apt_signing.verify(target, key_dir / apt_signing.PUBLIC_GPG)
    assert not (target / "demo_1.0_all.deb").exists() and not (target / "demo_1.0_all.deb").is_symlink()


# ---------------------------------------------------------------- pip: hash-pinned locks

def _wheels(d: Path) -> dict[str, Path]:
    made = {
        "alpha": wheelhouse.build_pure_wheel(d, "Alpha", "1.0", {"alpha/__init__.py": b""}, ["beta==2.0"]),
        "beta": wheelhouse.build_pure_wheel(d, "beta", "2.0", {"beta/__init__.py": b""}, []),
        # staged without its dependencies (as NIXL is in the lab): delta is not in the wheelhouse
        "gamma": wheelhouse.build_pure_wheel(d, "gamma_x", "3.0", {"gamma_x/__init__.py": b""}, ["delta>=1"]),
        "other": wheelhouse.build_pure_wheel(d, "other", "4.0", {"other/__init__.py": b""}, []),
    }
    return made


def _pip(*args, env=None):
    # Only the arguments count: none of this machine's pip configuration (index, constraints).
    base = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          env=dict(base, PIP_CONFIG_FILE=os.devnull, **(env or {})))


def test_lock_pins_every_wheel_of_the_set_with_the_hash_of_its_file(tmp_path):
    wheels = _wheels(tmp_path / "wheels")
    lock = wheelhouse.write_lock(tmp_path / "wheels", "demo-1", ["alpha==1.0"], ["gamma-x==3.0"])
    assert lock.name == "requirements-demo-1.txt"
    pins = wheelhouse.read_lock(lock)
    assert sorted(pins) == ["alpha", "beta", "gamma-x"]  # dependencies in, other sets' wheels out
    for name, key in (("alpha", "alpha"), ("beta", "beta"), ("gamma-x", "gamma")):
        version, hashes = pins[name]
        assert hashes == [wheelhouse._sha256(wheels[key])], name
        assert wheels[key].name.split("-")[1] == version
    for line in lock.read_text().splitlines():
        assert line.startswith("#") or re.fullmatch(r"[a-z0-9-]+==\S+( --hash=sha256:[0-9a-f]{64})+", line), line
    # The same inputs write the same file (a second `pdctl-lab up` changes nothing).
    before = lock.read_text()
    wheelhouse.write_lock(tmp_path / "wheels", "demo-1", ["alpha==1.0"], ["gamma-x==3.0"])
    assert lock.read_text() == before


def test_lock_refuses_a_requirement_the_wheelhouse_cannot_satisfy(tmp_path):
    _wheels(tmp_path / "wheels")
    with pytest.raises(RuntimeError, match="resolving"):
        wheelhouse.write_lock(tmp_path / "wheels", "demo", ["gamma-x==3.0"])  # with deps: no delta


def test_pip_installs_the_lock_and_refuses_a_wheel_whose_hash_is_not_in_it(tmp_path):
    wheels = _wheels(tmp_path / "wheels")
    lock = wheelhouse.write_lock(tmp_path / "wheels", "demo", ["alpha==1.0"], ["gamma-x==3.0"])
    install = ["install", "--quiet", "--require-hashes", "--no-deps", "--no-index", "--find-links",
               str(tmp_path / "wheels")]
    ok = _pip(*install, "--target", str(tmp_path / "ok"), "-r", str(lock))
    assert ok.returncode == 0, ok.stderr
    assert {p.name for p in (tmp_path / "ok").iterdir() if not p.name.endswith(".dist-info")} == \
        {"alpha", "beta", "gamma_x"}
    # A requirement the lock does not hash is refused as well.
    unpinned = tmp_path / "unpinned.txt"
    unpinned.write_text(lock.read_text() + "other==4.0\n")
    res = _pip(*install, "--target", str(tmp_path / "unpinned"), "-r", str(unpinned))
    assert res.returncode != 0 and "Hashes are required" in res.stderr, res.stderr
    # The wheel on the store is replaced (same name, other content): its hash is not the lock's.
    wheelhouse.build_pure_wheel(tmp_path / "wheels", "beta", "2.0", {"beta/__init__.py": b"evil = 1\n"}, [])
    assert wheelhouse._sha256(wheels["beta"]) not in wheelhouse.read_lock(lock)["beta"][1]
    bad = _pip(*install, "--target", str(tmp_path / "bad"), "-r", str(lock))
    assert bad.returncode != 0 and "DO NOT MATCH THE HASHES" in bad.stderr, bad.stderr


def fake_download(requirements, dest, python_version=None, platforms=(), no_deps=False):
    """`pip download` without a network: the stand-in wheel's requirements built as empty wheels."""
    todo = list(requirements)
    while todo:
        req = todo.pop()
        if req.endswith(".whl"):
            with zipfile.ZipFile(req) as zf:
                meta = next(n for n in zf.namelist() if n.endswith("/METADATA"))
                todo += [ln.split(": ", 1)[1] for ln in zf.read(meta).decode().splitlines()
                         if ln.startswith("Requires-Dist: ")]
            continue
        name, version = req.split(";")[0].strip().split("==")
        wheelhouse.build_pure_wheel(dest, name, version, {}, [])


def test_lab_stages_one_lock_per_venv_named_as_the_roles_ask(tmp_path, monkeypatch):
    """ensure_wheels with `pip download` replaced by locally built wheels: both locks, NIXL pinned."""
    from pdctl.lab import stage

    monkeypatch.setattr(stage.image, "cache_dir", lambda: tmp_path / "cache")
    monkeypatch.setattr(stage.wheelhouse, "download", fake_download)
    (tmp_path / "cache").mkdir()
    # A new checkout: `pdctl-lab up` stages the wheelhouse before the store (.lab/store) exists.
    stage.ensure_wheels(tmp_path / "lab", ROOT / "inventories" / "lab")
    wheels = tmp_path / "lab" / "store" / "wheels"
    versions = yaml.safe_load((ROOT / "inventories/b300/group_vars/all/versions.yml").read_text())["pdctl_versions"]
    engine = wheelhouse.read_lock(wheels / ("requirements-vllm-%s.txt" % versions["vllm"]))
    router = wheelhouse.read_lock(wheels / ("requirements-router-%s.txt" % versions["vllm_router"]))
    assert engine["nixl-cu13"][0] == versions["nixl"] and engine["pdctl-lab-engine"][1]
    assert "numpy" in engine and "vllm-router" not in engine
    assert router == {"vllm-router": router["vllm-router"]} and router["vllm-router"][0] == versions["vllm_router"]
    for pins in (engine, router):
        for name, (version, hashes) in pins.items():
            (wheel,) = [w for w in wheels.glob("*.whl")
                        if wheelhouse._canonical(w.name.split("-")[0]) == name and w.name.split("-")[1] == version]
            assert hashes == [wheelhouse._sha256(wheel)], name
    # Every lock is published clearsigned with this lab's key (store/locks), what the hosts read (issue 38).
    keyring = tmp_path / "lab" / "apt-signing" / apt_signing.PUBLIC_GPG
    locks = tmp_path / "lab" / "store" / "locks"
    assert sorted(p.name for p in locks.iterdir()) == sorted(wheelhouse.signed_name(p.name[len("requirements-"):-len(".txt")])
                                                             for p in wheels.glob("requirements-*.txt"))
    for lock in wheels.glob("requirements-*.txt"):
        assert wheelhouse.verify_lock(locks / (lock.name + ".asc"), keyring) == lock.read_text(), lock.name


def test_roles_install_their_venvs_from_the_lock_with_hashes():
    vllm_defaults = yaml.safe_load((ROOT / "roles/vllm/defaults/main.yml").read_text())
    router_defaults = yaml.safe_load((ROOT / "roles/router/defaults/main.yml").read_text())
    # The signed lock (issue 38): the store key clearsigns it, the host verifies it before pip reads it.
    assert vllm_defaults["vllm_requirements_lock_url"].endswith("/locks/requirements-vllm-{{ vllm_version }}.txt.asc")
    assert router_defaults["router_requirements_lock_url"].endswith(
        "/locks/requirements-router-{{ router_version }}.txt.asc")
    env = yaml.safe_load((ROOT / "roles/vllm/vars/main.yml").read_text())["_vllm_pip_environment"]
    assert env["PIP_REQUIRE_HASHES"] == "1" and env["PIP_NO_DEPS"] == "1" and env["PIP_NO_INDEX"] == "1"
    for path, role in (("roles/vllm/tasks/0010-venv.yml", "vllm"), ("roles/router/tasks/0010-install.yml", "router")):
        tasks = yaml.safe_load((ROOT / path).read_text())
        pips = [t["ansible.builtin.pip"] for t in tasks if "ansible.builtin.pip" in t]
        assert len(pips) == 1 and "_%s_verified_lock" % role in pips[0]["requirements"], path
        names = [t["name"] for t in tasks]
        # verified, and refused unless verified (lock.yml), before pip or the lock's copy is used
        verify = next(i for i, t in enumerate(tasks) if t.get("ansible.builtin.import_tasks") == "lock.yml")
        assert verify < names.index("The verified lock is where pip reads it") < next(
            i for i, t in enumerate(tasks) if "ansible.builtin.pip" in t)
        lock = yaml.safe_load((ROOT / "roles" / role / "tasks/lock.yml").read_text())
        gpgv = next(t for t in lock if "gpgv" in str(t.get("ansible.builtin.command", "")))
        assert gpgv["ansible.builtin.command"]["argv"][:3] == ["gpgv", "--keyring", "{{ %s_lock_keyring }}" % role]
        assert lock[-1]["name"] == "The lock is signed by the artifact store's key"
    for role in ("vllm", "router"):
        content = yaml.safe_load((ROOT / "roles" / role / "vars/main.yml").read_text())["_%s_lock_content" % role]
        assert "_%s_lock_gpgv.stdout" % role in content, role
    assert "PIP_REQUIRE_HASHES" in (ROOT / "roles/router/tasks/0010-install.yml").read_text()


# ---------------------------------------------------------------- roles, inventories, preflight

def test_nothing_trusts_an_apt_source_unsigned():
    pattern = re.compile(r"(?i)trusted\s*[:=]\s*yes|allow-insecure|AllowInsecureRepositories")
    for top in ("roles", "inventories", "playbooks", "molecule"):
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and path.suffix in (".yml", ".yaml", ".j2", ".list", ".sources", ""):
                text = path.read_text(errors="replace")
                # preflight's own search pattern names what it refuses
                if "preflight" in path.parts:
                    continue
                assert not pattern.search(text), path
    template = (ROOT / "roles/host_base/templates/pdctl-store.sources.j2").read_text()
    assert "Signed-By: {{ host_base_store_keyring }}" in template


LAB_KEY = ("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZ0000BYJKwYBBAHaRw8BAQdA\n"
           "-----END PGP PUBLIC KEY BLOCK-----\n")


def _sources(tmp_path, files):
    etc = tmp_path / "etc-apt"
    (etc / "sources.list.d").mkdir(parents=True)
    for name, text in files.items():
        (etc / name).write_text(text)
    return {"preflight_apt_sources_dirs": [str(etc), str(etc / "sources.list.d")]}


def test_preflight_refuses_an_inventory_without_the_signing_key(tmp_path):
    ok, out = run_role_tasks(tmp_path, "preflight", "0050-supply-chain.yml", _sources(tmp_path, {}))
    assert not ok
    assert "pdctl_artifact_store_signing_key is missing" in out and "Nothing was changed" in out, out
    ok, out = run_role_tasks(tmp_path, "preflight", "0050-supply-chain.yml",
                             dict(_sources(tmp_path / "b", {}), pdctl_artifact_store_signing_key="/etc/key.gpg"))
    assert not ok and "not an ASCII-armored OpenPGP public key" in out, out


def test_preflight_refuses_a_host_with_an_apt_source_trusted_unsigned(tmp_path):
    files = {"sources.list": "# deb [trusted=yes] http://commented.example/ ./\n",
             "sources.list.d/pdctl-store.sources": "Types: deb\nTrusted: yes\n",  # host_base rewrites it
             "sources.list.d/site.list": "deb [arch=amd64 trusted=yes] http://mirror.example/ ./\n",
             "sources.list.d/vendor.sources": "Types: deb\nURIs: http://vendor.example/\nTrusted: yes\n",
             "sources.list.d/signed.sources": "Types: deb\nSigned-By: /etc/apt/keyrings/x.asc\n"}
    ok, out = run_role_tasks(tmp_path, "preflight", "0050-supply-chain.yml",
                             dict(_sources(tmp_path, files), pdctl_artifact_store_signing_key=LAB_KEY))
    assert not ok
    assert "site.list" in out and "vendor.sources" in out and "without checking a signature" in out, out
    assert "pdctl-store.sources" not in out  # host_base rewrites its own file
    assert "signed.sources" not in out


STORE = "http://store.example:8780"
PINNED = {"pdctl_artifact_store_url": STORE, "pdctl_model_revision": "0123456789abcdef0123456789abcdef01234567",
          "pdctl_model_source": "hf://nvidia/GLM-5.2-NVFP4", "pdctl_model_hub_endpoint": STORE + "/hub"}


def test_preflight_accepts_the_key_and_signed_sources(tmp_path):
    files = {"sources.list.d/pdctl-store.sources": "Types: deb\nSigned-By: /etc/apt/keyrings/pdctl-store.asc\n",
             "sources.list.d/pdctl-store.sources.bak": "Trusted: yes\n"}  # not a sources file: apt ignores it
    ok, out = run_role_tasks(tmp_path, "preflight", "0050-supply-chain.yml",
                             dict(_sources(tmp_path, files), pdctl_artifact_store_signing_key=LAB_KEY,
                                  pdctl_cuda_apt_repo={"uri": STORE + "/cuda/", "signed_by": LAB_KEY}, **PINNED))
    assert ok, out
    ok, out = run_role_tasks(tmp_path / "c", "preflight", "0050-supply-chain.yml",
                             dict(_sources(tmp_path / "c", {}), pdctl_artifact_store_signing_key=LAB_KEY,
                                  pdctl_cuda_apt_repo={"uri": STORE + "/cuda/"}, **PINNED))
    assert not ok and "pdctl_cuda_apt_repo has no signed_by" in out, out


def test_preflight_refuses_host_facing_sources_outside_the_store(tmp_path):
    """Issue 38: an air-gapped host reaches only the store; a key URL would be fetched by the host."""
    nvidia = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/"
    ok, out = run_role_tasks(tmp_path, "preflight", "0050-supply-chain.yml", dict(
        _sources(tmp_path, {}), pdctl_artifact_store_signing_key=LAB_KEY,
        pdctl_cuda_apt_repo={"uri": nvidia, "signed_by": nvidia + "3bf863cc.pub"},
        **dict(PINNED, pdctl_model_hub_endpoint="https://huggingface.co")))
    assert not ok
    assert "pdctl_cuda_apt_repo.uri = " + nvidia in out and "https://huggingface.co" in out, out
    assert "signed_by is not a key block" in out and "Nothing was changed" in out, out
    # A prefix that only looks like the store's is not the store.
    ok, out = run_role_tasks(tmp_path / "b", "preflight", "0050-supply-chain.yml", dict(
        _sources(tmp_path / "b", {}), pdctl_artifact_store_signing_key=LAB_KEY,
        **dict(PINNED, pdctl_model_hub_endpoint=STORE + "0/hub")))
    assert not ok and STORE + "0/hub" in out, out
    # The lab's Hub stub, allowed by name.
    ok, out = run_role_tasks(tmp_path / "c", "preflight", "0050-supply-chain.yml", dict(
        _sources(tmp_path / "c", {}), pdctl_artifact_store_signing_key=LAB_KEY,
        pdctl_host_sources_allowed=["http://10.89.64.1:8781"],
        **dict(PINNED, pdctl_model_hub_endpoint="http://10.89.64.1:8781")))
    assert ok, out


def test_preflight_refuses_the_placeholder_model_revision(tmp_path):
    for i, revision in enumerate(("0" * 40, "")):
        ok, out = run_role_tasks(tmp_path / str(i), "preflight", "0050-supply-chain.yml", dict(
            _sources(tmp_path / str(i), {}), pdctl_artifact_store_signing_key=LAB_KEY,
            **dict(PINNED, pdctl_model_revision=revision)))
        assert not ok, revision
        assert "The model revision is" in out and "pin the Hub commit" in out and "Nothing was changed" in out, out


def test_b300_render_inputs_point_hosts_only_at_the_store():
    """The production inventory as preflight reads it: no apt source, key URL or Hub outside the store."""
    assert group_var("b300", "pdctl_cuda_apt_repo") == {}
    assert group_var("b300", "pdctl_model_hub_endpoint").startswith("{{ pdctl_artifact_store_url }}/")
    for role in ("nvidia_driver", "cuda_toolkit", "rdma", "nvidia_fabric", "host_base"):
        for path in (ROOT / "roles" / role).rglob("*.yml"):
            text = path.read_text()
            assert not re.search(r"https?://(?!pdctl-controller\.example)[^\s\"']+\.(pub|asc|gpg|key)\b", text), path


def test_inventories_give_the_key_or_say_how():
    assert "apt-signing/pdctl-store.asc" in group_var("lab", "pdctl_artifact_store_signing_key")
    # b300 leaves the key to the site (no default): its store file says, commented, how to give it.
    b300 = (ROOT / "inventories/b300/group_vars/all/artifact_store.yml").read_text()
    assert "pdctl_artifact_store_signing_key" in b300 and "apt_signing" in b300


# ---------------------------------------------------------------- preflight: memory floor (issue 38)

def _host_check(tmp_path, memtotal_mb):
    """roles/preflight 0030-host.yml on this machine, with MemTotal given (extra vars win over the fact)."""
    tmp_path.mkdir()
    return run_role_tasks(tmp_path, "preflight", "0030-host.yml", {
        "pdctl_supported_os": [{"distribution": "Debian", "version": "12"}, {"distribution": "Ubuntu", "version": "24.04"}],
        "pdctl_min_cpus": 1, "pdctl_min_memory_gb": 1024, "pdctl_model_path": str(tmp_path),
        "pdctl_model_size_gb": 0, "pdctl_model_disk_margin_pct": 0, "pdctl_real_kernel": False,
        "pdctl_secure_boot_allowed": False, "_preflight_memtotal_mb": memtotal_mb})


def test_preflight_memory_floor_accepts_a_host_with_1_tib_installed(tmp_path):
    # MemTotal of a 1 TiB host: installed less firmware and kernel reservations (about 1007 GiB).
    ok, out = _host_check(tmp_path / "a", 1007 * 1024 + 400)
    assert ok, out
    ok, out = _host_check(tmp_path / "b", 960 * 1024)  # 960 GiB: not a 1 TiB host
    assert not ok
    assert "960.0 GiB memory (MemTotal)" in out and ">= 1024 GiB installed" in out and "972.8 GiB" in out, out


# ---------------------------------------------------------------- signed locks (issue 38)

def test_a_signed_lock_verifies_to_its_text_and_an_edited_one_does_not(tmp_path, gpg):
    _wheels(tmp_path / "wheels")
    lock = wheelhouse.write_lock(tmp_path / "wheels", "demo", ["alpha==1.0"])
    signed = wheelhouse.sign_lock(tmp_path / "key", lock, tmp_path / "locks")
    assert signed == tmp_path / "locks" / "requirements-demo.txt.asc"
    keyring = tmp_path / "key" / apt_signing.PUBLIC_GPG
    assert wheelhouse.verify_lock(signed, keyring) == lock.read_text()
    before = signed.read_bytes()
    assert wheelhouse.sign_lock(tmp_path / "key", lock, tmp_path / "locks") == signed
    assert signed.read_bytes() == before  # kept: it still verifies to the lock's text
    # One hash edited in the signed text: gpgv refuses it.
    text = signed.read_text()
    signed.write_text(re.sub(r"sha256:[0-9a-f]", "sha256:f" if "sha256:0" in text else "sha256:0", text, count=1))
    assert wheelhouse.verify_lock(signed, keyring) is None
    # Another store's key does not vouch for ours.
    apt_signing.ensure_key(tmp_path / "theirs")
    signed.write_bytes(before)
    assert wheelhouse.verify_lock(signed, tmp_path / "theirs" / apt_signing.PUBLIC_GPG) is None


def test_host_base_installs_the_store_key_as_gpgv_reads_it(tmp_path, gpg):
    """The armored key from the inventory, dearmored on the host: gpgv verifies a signed lock with it;
    a second run changes nothing."""
    _wheels(tmp_path / "wheels")
    lock = wheelhouse.write_lock(tmp_path / "wheels", "demo", ["alpha==1.0"])
    signed = wheelhouse.sign_lock(tmp_path / "key", lock)
    keyring = tmp_path / "pdctl-store.gpg"
    extravars = {"pdctl_service_user": "pdctl", "pdctl_artifact_store_url": STORE, "pdctl_model_path": "/m/x",
                 "pdctl_real_kernel": False, "host_base_store_gpgv_keyring": str(keyring),
                 "pdctl_artifact_store_signing_key": (tmp_path / "key" / apt_signing.PUBLIC_ASC).read_text()}
    ok, out = run_role_tasks(tmp_path, "host_base", "0015-lock-keyring.yml", extravars)
    assert ok, out
    assert keyring.read_bytes() == (tmp_path / "key" / apt_signing.PUBLIC_GPG).read_bytes()
    assert oct(keyring.stat().st_mode & 0o777) == "0o644"
    assert wheelhouse.verify_lock(signed, keyring) == lock.read_text()
    ok, out = run_role_tasks(tmp_path, "host_base", "0015-lock-keyring.yml", extravars)
    assert ok and re.search(r"changed=0\b", out), out


def test_b300_render_shows_the_hosts_apt_source_and_key_and_no_url_outside_the_store(tmp_path, capsys):
    """Issue 38 acceptance 3: what `pdctl render -i inventories/b300` shows a host gets."""
    from pdctl import cli

    assert cli.main(["render", "-i", str(ROOT / "inventories/b300"), "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    hosts = sorted(p.name for p in tmp_path.iterdir())
    assert hosts
    store = group_var("b300", "pdctl_artifact_store_url")
    for host in hosts:
        sources = sorted(p.name for p in (tmp_path / host / "etc/apt/sources.list.d").iterdir())
        assert sources == ["pdctl-store.sources"], (host, sources)
        text = (tmp_path / host / "etc/apt/sources.list.d/pdctl-store.sources").read_text()
        assert "URIs: %s/apt/" % store in text and "Signed-By: /etc/apt/keyrings/pdctl-store.asc" in text
        assert sorted(p.name for p in (tmp_path / host / "etc/apt/keyrings").iterdir()) == ["pdctl-store.asc"]
    # Every URL a host is given: the store, or the plan's own instances (the P/D router's upstreams).
    planned = {i["address"] for i in inventory.plan(ROOT / "inventories/b300")["instances"]}  # any host count
    for path in tmp_path.rglob("*"):
        if path.is_file():
            for url in re.findall(r"https?://[^\s\"'<>,]+", path.read_text(errors="replace")):
                assert url.startswith(store + "/") or re.match(r"https?://([\d.]+):", url).group(1) in planned, (path, url)


@pytest.fixture
def lock_server(tmp_path):
    """A signed lock (and an edited copy) served over HTTP, and the store key as host_base installs it."""
    import functools
    import http.server
    import threading

    from pdctl import store

    _wheels(tmp_path / "wheels")
    lock = wheelhouse.write_lock(tmp_path / "wheels", "demo", ["alpha==1.0"])
    signed = wheelhouse.sign_lock(tmp_path / "key", lock, tmp_path / "www" / "locks")
    text = signed.read_text()
    (signed.parent / "edited.txt.asc").write_text(text.replace("alpha==1.0", "alpha==1.1", 1))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(store._Handler, directory=str(tmp_path / "www")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"url": "http://127.0.0.1:%d/locks/" % server.server_address[1], "lock": lock,
           "keyring": str(tmp_path / "key" / apt_signing.PUBLIC_GPG)}
    server.shutdown()


@pytest.mark.parametrize("role", ["vllm", "router"])
def test_the_roles_refuse_a_lock_the_store_key_did_not_sign(tmp_path, gpg, lock_server, role):
    """roles/<role>/tasks/lock.yml on this machine against a served store: the signed lock passes and its
    verified text is what the role goes on with; an edited one is refused naming the file; another key's
    signature is refused too."""
    def run(name, keyring, sub):
        url = lock_server["url"] + name
        (tmp_path / sub).mkdir()
        return url, run_role_tasks(tmp_path / sub, role, "lock.yml", {
            "%s_requirements_lock_url" % role: url, "%s_lock_keyring" % role: keyring, "vllm_switch_to": ""},
            env={"PATH": "/usr/bin:/bin"})

    url, (ok, out) = run("requirements-demo.txt.asc", lock_server["keyring"], "good")
    assert ok, out
    url, (ok, out) = run("edited.txt.asc", lock_server["keyring"], "edited")
    assert not ok
    assert "%s does not verify with the artifact store's key" % url in out and "BAD signature" in out, out
    apt_signing.ensure_key(tmp_path / "theirs")
    url, (ok, out) = run("requirements-demo.txt.asc", str(tmp_path / "theirs" / apt_signing.PUBLIC_GPG), "other")
    assert not ok and "does not verify with the artifact store's key" in out, out
    # A host host_base has not given the key yet is told so.
    url, (ok, out) = run("requirements-demo.txt.asc", str(tmp_path / "missing.gpg"), "nokey")
    assert not ok and "The store key for gpgv is not installed on this host" in out, out


def test_router_install_refuses_a_swapped_wheel_and_an_edited_lock_and_installs_nothing(tmp_path, gpg):
    """roles/router 0010-install.yml on this machine against a served store (real gpgv, real pip): a wheel
    swapped in the store, and the signed lock edited in the store, are each refused with a message naming
    the file, and nothing is installed."""
    import functools
    import http.server
    import threading

    from pdctl import store

    www = tmp_path / "www"
    _wheels(www / "wheels")
    lock = wheelhouse.write_lock(www / "wheels", "router-9.9", ["alpha==1.0"])
    signed = wheelhouse.sign_lock(tmp_path / "key", lock, www / "locks")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(store._Handler, directory=str(www)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = "http://127.0.0.1:%d" % server.server_address[1]
    venvs = tmp_path / "venvs"

    def install(sub):
        (tmp_path / sub).mkdir()
        return run_role_tasks(tmp_path / sub, "router", "0010-install.yml", {
            "router_version": "9.9", "router_venvs_dir": str(venvs), "router_wheelhouse_url": base + "/wheels/",
            "router_requirements_lock_url": base + "/locks/" + signed.name,
            "router_lock_keyring": str(tmp_path / "key" / apt_signing.PUBLIC_GPG)})

    try:
        # A wheel swapped in the store (same name, other bytes): pip refuses it by the lock's sha256.
        beta = wheelhouse.build_pure_wheel(www / "wheels", "beta", "2.0", {"beta/__init__.py": b"evil = 1\n"}, [])
        ok, out = install("swapped")
        assert not ok
        assert "DO NOT MATCH THE HASHES" in out and "%s/wheels/%s" % (base, beta.name) in out, out
        site = list(venvs.glob("router-9.9/lib/python3*/site-packages"))
        assert not any((s / name).exists() for s in site for name in ("alpha", "beta")), "a refused install left files"
        assert not (venvs / "router-9.9" / "pdctl-requirements.lock").exists()

        # The signed lock edited in the store (a hash changed to the swapped wheel's): gpgv refuses it first.
        text = signed.read_text()
        old = wheelhouse.read_lock(lock)["beta"][1][0]
        signed.write_text(text.replace(old, wheelhouse._sha256(beta)))
        ok, out = install("edited")
        assert not ok
        assert "%s/locks/%s does not verify with the artifact store's key" % (base, signed.name) in out, out
        assert "Nothing was installed" in out and "Router venv holds exactly" not in out, out
        assert not any((s / name).exists() for s in site for name in ("alpha", "beta"))
    finally:
        server.shutdown()
