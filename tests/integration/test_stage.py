"""`pdctl stage --check` (issue 38) on the production inventory: the registry's part resolved for real
against the package registry (metadata only), every other upstream (FlashInfer's index and release
downloads, NVIDIA's apt repositories, the Hub) a local stand-in served over HTTP with the inventory's
source URLs pointed at it (--source, --key): the code path is the production one."""
from __future__ import annotations

import functools
import http.server
import threading

import pytest
import yaml

from inventories import ROOT, inventory_variant, defining_file, group_var
from pdctl import cli, stage, store
from pdctl.lab import store as lab_store

B300 = ROOT / "inventories" / "b300"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The stand-ins of the unreachable upstreams, built from the production inventory and served."""
    root = tmp_path_factory.mktemp("upstreams")
    hv = stage.load(B300, {})
    made = lab_store.stage_upstream_standins(root, hv)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(store._Handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = "http://127.0.0.1:%d" % server.server_address[1]
    yield hv, made, url
    server.shutdown()


def _args(hv, made, url):
    args = []
    for name in hv["pdctl_stage_sources"]:
        if name != "pypi":
            args += ["--source", "%s=%s/%s/" % (name, url, name)]
    for repo, key in made["keys"].items():
        args += ["--key", "%s=%s" % (repo, key)]
    return args


def test_check_resolves_every_production_artifact_against_the_registry_and_the_stand_ins(served, tmp_path, capsys):
    hv, made, url = served
    # The production inventory with the pins filled in as an operator would (the stand-ins' sha256,
    # a model commit), and the Hub pointed at the stand-in's revision API.
    wheels = [dict(pin, sha256=made["sha256"][pin["file"]]) for pin in hv["pdctl_stage_wheels"]]
    versions = dict(hv["pdctl_versions"], model_revision=made["revision"])
    inv = inventory_variant(tmp_path / "inv", {"group_vars/all": {
        "pdctl_stage_wheels": wheels, "pdctl_versions": versions, "pdctl_stage_model_hub": url + "/hub"}}, base="b300")
    code = cli.main(["stage", "--check", "-i", str(inv)] + _args(hv, made, url))
    out = capsys.readouterr().out
    assert code == stage.EXIT_OK, out
    rows = [line.split() for line in out.splitlines()[:-1]]
    assert rows and all(r[0] == "ok" for r in rows), out
    # The registry's part, resolved for the hosts' Python and platform, dependencies included, each with its sha256.
    by_name = {(r[2], r[3]): r for r in rows}
    for name, version in (("vllm", "0.33.0"), ("flashinfer-python", "0.7.2.post1"), ("vllm-router", "0.1.17"),
                          ("nixl", "1.5.1")):
        row = by_name[(name, version)]
        assert row[4] == "pypi" and row[5] == "sha256" and len(row[6]) == 64, row
    assert len([r for r in rows if r[4] == "pypi"]) > 50  # torch, CUDA libraries, ...
    # FlashInfer's wheels from their named source, the architecture's JIT cache among them.
    for pin in wheels:
        assert any(pin["file"] in line and pin["sha256"] in line for line in out.splitlines()), pin["file"]
    assert "flashinfer-jit-cache-sm103a" in out
    # Every host-stack package from the signed stand-in repository; the model at its revision.
    for repo in hv["pdctl_stage_apt"].values():
        for item in repo["packages"]:
            assert any(line.split()[:3] == ["ok", "deb", item.split("=")[0]] for line in out.splitlines()), item
    assert "model nvidia/GLM-5.2-NVFP4" in " ".join(out.split()) and made["revision"] in out


def test_check_names_a_file_whose_source_lists_another_sha256(served):
    hv, made, url = served
    hv = stage.load(B300, {n: "%s/%s/" % (url, n) for n in hv["pdctl_stage_sources"] if n != "pypi"})
    pin = next(p for p in hv["pdctl_stage_wheels"] if p.get("layout") != "files")
    row = stage.check_pinned_wheel(hv, dict(pin, sha256="0" * 64))
    assert row.status == stage.MISSING and made["sha256"][pin["file"]] in row.detail, row
    # Not pinned yet: the source's sha256 is shown to review, not taken.
    row = stage.check_pinned_wheel(hv, dict(pin, sha256=""))
    assert row.status == stage.UNPINNED and made["sha256"][pin["file"]] in row.detail, row
    assert stage.exit_code([row]) == stage.EXIT_UNPINNED
    assert stage.exit_code([row, stage.Row("wheel", "x", "1", "s", stage.MISSING)]) == stage.EXIT_MISSING


def test_check_refuses_an_apt_repository_its_key_does_not_verify(served, tmp_path):
    hv, made, url = served
    keys = dict(made["keys"])
    keys["cuda"] = keys["doca"]  # another repository's key
    hv = stage.load(B300, {n: "%s/%s/" % (url, n) for n in hv["pdctl_stage_sources"] if n != "pypi"},
                    {k: str(v) for k, v in keys.items()})
    rows = stage.check_apt(hv)
    cuda = [r for r in rows if r.source.startswith("cuda-ubuntu2404")]
    assert cuda and all(r.status == stage.MISSING and "does not verify" in r.detail for r in cuda), cuda
    assert all(r.status == stage.OK for r in rows if r.source.startswith("doca")), rows


def test_unreachable_upstreams_are_told_apart_from_missing_pins():
    hv = stage.load(B300, {"flashinfer-cu130": "http://127.0.0.1:9/", "flashinfer-releases": "http://127.0.0.1:9/"})
    pin = next(p for p in hv["pdctl_stage_wheels"] if p.get("layout") != "files")
    assert stage.check_pinned_wheel(hv, dict(pin, sha256="ab" * 32)).status == stage.UNREACHABLE
    assert stage.check_pinned_wheel(hv, pin).status == stage.UNPINNED  # the production inventory: not pinned yet
    rows = stage.check_model(hv)
    assert rows[0].status == stage.UNPINNED and "placeholder" in rows[0].detail


def test_production_inventory_names_a_source_for_every_pin():
    hv = stage.load(B300, {})
    names = {p["name"] for p in hv["pdctl_stage_wheels"]}
    assert {"flashinfer-cubin", "flashinfer-jit-cache", "flashinfer-jit-cache-sm103a"} <= names
    for pin in hv["pdctl_stage_wheels"]:
        assert pin["version"].startswith(hv["pdctl_versions"]["flashinfer"]), pin  # == flashinfer-python's
        assert pin["source"] in hv["pdctl_stage_sources"] and "sha256" in pin, pin
    assert "flashinfer-cubin" not in " ".join(stage.registry_requirements(hv)[0])
    text = defining_file(B300, "pdctl_stage_wheels").read_text()
    assert "pdctl stage --check" in text  # says how a pin is filled
    assert group_var(B300, "pdctl_cuda_apt_repo") == {}


def test_staging_mirrors_the_apt_packages_and_the_model_into_the_store_signed(served, tmp_path):
    """Without --check: the stand-in repositories' packages into store/apt (checked against their signed
    index), indexed and signed with the store key; the model's revision into store/hub in the Hub's layout."""
    from pdctl import apt_signing
    from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model_sources import HubSource

    hv, made, url = served
    hv = stage.load(B300, {n: "%s/%s/" % (url, n) for n in hv["pdctl_stage_sources"] if n != "pypi"},
                    {k: str(v) for k, v in made["keys"].items()})
    hv.update(pdctl_model_revision=made["revision"], pdctl_stage_model_hub=url + "/hub")
    store_dir, key_dir = tmp_path / "store", tmp_path / "key"
    apt = stage.stage_apt(hv, store_dir, key_dir)
    assert apt_signing.verify(apt, key_dir / apt_signing.PUBLIC_GPG)
    packages = (apt / "Packages").read_text()
    for repo in hv["pdctl_stage_apt"].values():
        for item in repo["packages"]:
            assert "Package: %s\n" % item.split("=")[0] in packages, item
    stage.stage_model(hv, store_dir)
    # The hosts' Hub client reads the store as the Hub.
    with _serve(store_dir) as store_url:
        source = HubSource("nvidia/GLM-5.2-NVFP4", made["revision"], endpoint=store_url + "/hub")
        manifest = source.manifest(made["revision"])
    assert manifest["revision"] == made["revision"]
    assert sorted(f["path"] for f in manifest["files"]) == ["config.json", "model-00001-of-00001.safetensors"]
    # A package whose bytes differ from the signed index is refused, naming it.
    (apt / next(p.name for p in apt.glob("doca-ofed_*.deb"))).unlink()
    original = stage._pick
    stage._pick = lambda stanzas, package, version: dict(original(stanzas, package, version), SHA256="0" * 64)
    try:
        with pytest.raises(stage.StageError, match=r"\.deb: sha256 [0-9a-f]{64}, expected 0{64}"):
            stage.stage_apt(hv, store_dir, key_dir)
    finally:
        stage._pick = original


class _serve:
    def __init__(self, root):
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(store._Handler, directory=str(root)))

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def __exit__(self, *exc):
        self.server.shutdown()


def test_staging_refuses_to_start_while_a_pin_is_missing(tmp_path, capsys):
    """The production inventory as shipped: nothing is downloaded, every missing pin is named."""
    code = cli.main(["stage", "-i", str(B300), "--store", str(tmp_path / "store"), "--key-dir", str(tmp_path / "key")])
    err = capsys.readouterr().err
    assert code == stage.EXIT_UNPINNED and not (tmp_path / "store").exists()
    for name in ("flashinfer-jit-cache-sm103a", "pdctl_stage_apt.cuda", "model_revision"):
        assert name in err, err


def test_staging_writes_signed_locks_the_vllm_role_accepts(served, tmp_path):
    """Wheels staged for a small engine (one registry wheel and FlashInfer's pinned files from the stand-in
    index, the router from the registry): every wheel in store/wheels, each lock clearsigned into store/locks,
    the JIT cache pinned with its local version (+cu130) as the production requirement names it."""
    from pdctl import apt_signing, wheelhouse

    hv, made, url = served
    hv = stage.load(B300, {n: "%s/%s/" % (url, n) for n in hv["pdctl_stage_sources"] if n != "pypi"})
    hv["pdctl_stage_wheels"] = [dict(p, sha256=made["sha256"][p["file"]]) for p in hv["pdctl_stage_wheels"]]
    production = hv["pdctl_engine"]
    hv["pdctl_engine"] = {"packages": ["idna==3.10"] + [r for r in production["packages"] if r.startswith("flashinfer")],
                          "packages_no_deps": production["packages_no_deps"]}
    signed = stage.stage_wheels(hv, tmp_path / "store", tmp_path / "key")
    assert sorted(p.name for p in signed) == ["requirements-router-0.1.17.txt.asc", "requirements-vllm-0.33.0.txt.asc"]
    text = wheelhouse.verify_lock(signed[1], tmp_path / "key" / apt_signing.PUBLIC_GPG)
    pins = dict(line.split(" ")[0].split("==") for line in text.splitlines() if "==" in line)
    assert pins["flashinfer-jit-cache-sm103a"] == pins["flashinfer-jit-cache"] == "0.7.2.post1+cu130"
    assert pins["flashinfer-cubin"] == "0.7.2.post1" and pins["idna"] == "3.10"
    router = wheelhouse.verify_lock(signed[0], tmp_path / "key" / apt_signing.PUBLIC_GPG)
    assert "vllm-router==0.1.17 --hash=sha256:" in router
    for pin in hv["pdctl_stage_wheels"]:
        assert wheelhouse._sha256(tmp_path / "store" / "wheels" / pin["file"]) == pin["sha256"]
