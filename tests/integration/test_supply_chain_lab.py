"""Supply chain on the lab (issue 14, acceptance 8): apt on the hosts verifies the store's signature
(a tampered Release is refused), and pip refuses a wheel whose hash is not the lock's.

Every test leaves the hosts and the store as it found them: tampered copies live in directories of
their own (on the store and on the host, removed afterwards); apt runs with a private state dir."""
import re
import shutil
import subprocess
import uuid

import pytest
import yaml

from conftest import LAB_ENV
from inventories import ROOT, inventory_variant
from pdctl import runner, wheelhouse

pytestmark = [pytest.mark.lab]

STORE = "http://10.89.64.1:8780"
KEYRING = "/etc/apt/keyrings/pdctl-store.asc"
LAB = ROOT / ".lab"
_HOSTS = yaml.safe_load((ROOT / "inventories/lab/hosts.yml").read_text())["all"]["children"]
SERVING = sorted(h for pool in _HOSTS["serving"]["children"].values() for h in pool["hosts"])
ROUTERS = sorted(_HOSTS["router"]["hosts"])
VERSIONS = yaml.safe_load((ROOT / "inventories/b300/group_vars/all/versions.yml").read_text())["pdctl_versions"]


def on_host(host, *argv, check=True, stdin=None):
    res = subprocess.run(["podman", "exec", *(["-i"] if stdin is not None else []), host, *argv],
                         input=stdin, capture_output=True, text=True)
    if check:
        assert res.returncode == 0, "%s: %s failed (%d):\n%s\n%s" % (host, argv, res.returncode, res.stdout, res.stderr)
    return res


def apt_update(host, workdir, uri):
    """`apt-get update` of one source (Signed-By the store's installed key) in a private state dir:
    the host's own sources and package lists are neither read nor touched."""
    script = """set -e
d=%(d)s; rm -rf $d/lists $d/cache; mkdir -p $d/lists/partial $d/cache/archives/partial
echo 'deb [signed-by=%(key)s] %(uri)s ./' > $d/test.list
exec apt-get update -o Dir::Etc::SourceList=$d/test.list -o Dir::Etc::SourceParts=/nonexistent \\
  -o Dir::State::Lists=$d/lists -o Dir::Cache=$d/cache -o Debug::NoLocking=1 -o APT::Sandbox::User=root
""" % {"d": workdir, "key": KEYRING, "uri": uri}
    return on_host(host, "sh", "-c", script, check=False)


def test_hosts_trust_the_store_by_its_key_and_nothing_unsigned(converged_lab):
    key = (LAB / "apt-signing" / "pdctl-store.asc").read_text()
    for host in sorted(set(SERVING + ROUTERS)):
        sources = on_host(host, "cat", "/etc/apt/sources.list.d/pdctl-store.sources").stdout
        assert "Signed-By: %s" % KEYRING in sources and "Trusted" not in sources, (host, sources)
        assert on_host(host, "cat", KEYRING).stdout.strip() == key.strip(), host
        trusted = on_host(host, "sh", "-c", "grep -rilE 'trusted *(=|:) *yes' /etc/apt/sources.list "
                          "/etc/apt/sources.list.d/ 2>/dev/null || true").stdout
        assert not trusted.strip(), (host, trusted)
        # apt read the store through its signed InRelease (a flat repository's list file name)
        lists = on_host(host, "ls", "/var/lib/apt/lists").stdout
        assert re.search(r"10\.89\.64\.1:8780_apt_.*InRelease", lists), (host, lists)


def test_apt_refuses_a_tampered_release(converged_lab):
    """A copy of the store's index served beside it: apt accepts it as signed, then refuses it once one
    hash in the Release text changed (what a swapped Packages file needs)."""
    name = "tamper-%s" % uuid.uuid4().hex[:8]
    copy = LAB / "store" / name
    host = SERVING[0]
    workdir = "/tmp/pdctl-%s" % name
    try:
        copy.mkdir()
        for f in ("InRelease", "Release", "Release.gpg", "Packages"):
            shutil.copyfile(LAB / "store" / "apt" / f, copy / f)  # follows the links into the cache
        good = apt_update(host, workdir, "%s/%s/" % (STORE, name))
        assert good.returncode == 0, good.stdout + good.stderr
        assert "InRelease" in good.stdout and "not signed" not in good.stdout + good.stderr

        for f in ("InRelease", "Release"):
            text = (copy / f).read_text()
            tampered = re.sub(r"^( )[0-9a-f]{64}( +\d+ Packages)$", r"\g<1>" + "0" * 64 + r"\g<2>", text,
                              count=1, flags=re.M)
            assert tampered != text, "no SHA256 line for Packages in %s" % f
            (copy / f).write_text(tampered)
        bad = apt_update(host, workdir, "%s/%s/" % (STORE, name))
        out = bad.stdout + bad.stderr
        assert bad.returncode != 0, out
        assert "BADSIG" in out or "signatures were invalid" in out, out
        assert "is not signed" in out, out
    finally:
        shutil.rmtree(copy, ignore_errors=True)
        on_host(host, "rm", "-rf", workdir, check=False)
    assert on_host(host, "apt-get", "update", check=False).returncode == 0, "the store itself must still verify"


def test_pip_refuses_a_wheel_whose_hash_is_not_in_the_lock(converged_lab):
    """On a host, against the store: a line of the engine's lock installs; the same line with another
    hash, or a second wheel without one, is refused before anything is installed."""
    host = SERVING[0]
    lock = wheelhouse.read_lock(LAB / "store" / "wheels" / wheelhouse.lock_name("vllm-%s" % VERSIONS["vllm"]))
    small = [n for n in ("idna", "typing-extensions", "packaging", "h11", "attrs") if n in lock] + sorted(lock)
    first, second = small[0], next(n for n in small if n != small[0])
    line = "%s==%s --hash=sha256:%s" % (first, lock[first][0], lock[first][1][0])
    wrong = "%064x" % (int(lock[first][1][0], 16) ^ 1)
    cases = {"right": line + "\n",
             "wrong": "%s==%s --hash=sha256:%s\n" % (first, lock[first][0], wrong),
             "unhashed": line + "\n%s==%s\n" % (second, lock[second][0])}
    workdir = "/tmp/pdctl-hashcheck-%s" % uuid.uuid4().hex[:8]
    try:
        on_host(host, "python3", "-m", "venv", workdir + "/venv")
        results = {}
        for case, text in cases.items():
            on_host(host, "sh", "-c", "cat > %s/%s.txt" % (workdir, case), stdin=text)
            results[case] = on_host(host, workdir + "/venv/bin/pip", "install", "--require-hashes", "--no-deps",
                                    "--no-index", "--find-links", STORE + "/wheels/", "--trusted-host", "10.89.64.1",
                                    "--target", "%s/%s" % (workdir, case), "-r", "%s/%s.txt" % (workdir, case),
                                    check=False)
        assert results["right"].returncode == 0, results["right"].stderr
        assert results["wrong"].returncode != 0
        assert "DO NOT MATCH THE HASHES" in results["wrong"].stderr and wrong in results["wrong"].stderr, \
            results["wrong"].stderr
        assert results["unhashed"].returncode != 0 and "Hashes are required" in results["unhashed"].stderr, \
            results["unhashed"].stderr
        for case in ("wrong", "unhashed"):
            left = on_host(host, "ls", "-A", "%s/%s" % (workdir, case), check=False).stdout.split()
            assert not left, "a refused install left files in %s: %s" % (case, left)
    finally:
        on_host(host, "rm", "-rf", workdir, check=False)


def _freeze(host, venv):
    out = on_host(host, venv + "/bin/pip", "freeze", "--all").stdout
    pins = {}
    for line in out.splitlines():
        if "==" in line:
            pkg, version = line.split("==", 1)
            pins[wheelhouse._canonical(pkg)] = version
    return pins


@pytest.mark.parametrize("role", ["vllm", "router"])
def test_each_venv_holds_its_lock(converged_lab, role):
    """What the roles installed is what the lock pins, version for version (the hashes were checked
    by pip at install time; the lock is the one the store serves)."""
    version = VERSIONS["vllm" if role == "vllm" else "vllm_router"]
    lock = wheelhouse.read_lock(LAB / "store" / "wheels" / wheelhouse.lock_name("%s-%s" % (role, version)))
    for host in SERVING if role == "vllm" else ROUTERS:
        installed = _freeze(host, "/opt/pdctl/venvs/%s-%s" % (role, version))
        wrong = {n: (v, installed.get(n)) for n, (v, _) in lock.items() if installed.get(n) != v}
        assert not wrong, "%s: locked vs installed: %s" % (host, wrong)


def test_inventory_without_the_signing_key_stops_in_preflight(lab, tmp_path):
    inv = inventory_variant(tmp_path / "inv", {"group_vars/all": {"pdctl_artifact_store_signing_key": ""}})
    result = runner.run_playbook("site.yml", inv, envvars=LAB_ENV)
    assert not result.ok
    assert result.total("changed") == 0
    assert {f["task"] for f in result.failures} == {"Inventory provides the artifact store's signing key"}
    message = str(result.failures[0]["msg"])
    assert "pdctl_artifact_store_signing_key is missing" in message and "Nothing was changed" in message


def test_a_host_with_an_apt_source_trusted_unsigned_stops_in_preflight(lab, tmp_path):
    host = SERVING[0]
    path = "/etc/apt/sources.list.d/pdctl-test-trusted.list"
    try:
        on_host(host, "sh", "-c", "echo 'deb [trusted=yes] http://unsigned.invalid/ ./' > %s" % path)
        result = runner.run_playbook("site.yml", ROOT / "inventories/lab", envvars=LAB_ENV)
        assert not result.ok
        assert result.total("changed") == 0
        assert {f["task"] for f in result.failures} == {"No apt source is trusted unsigned"}
        assert path in str(result.failures[0]["msg"])
    finally:
        on_host(host, "rm", "-f", path, check=False)
