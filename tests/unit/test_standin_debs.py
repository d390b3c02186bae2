"""Lab stand-in packages: real names, manifest versions, the GPU emulator inside, staged by the store."""
import shutil
import subprocess

import pytest
import yaml

import requires
from inventories import ROOT
from pdctl.lab import standin_debs, store

HOST_STACK_ROLES = ("nvidia_driver", "nvidia_fabric", "cuda_toolkit", "rdma")


@pytest.fixture
def dpkg_deb():
    return requires.binary("dpkg-deb", "the stand-in .debs are built and read with dpkg-deb (package dpkg)")


def _field(deb, name):
    return subprocess.run(["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True, check=True).stdout.strip()


def test_versions_come_from_the_manifest():
    v = standin_debs.manifest()
    by_name = {s.name: s.version for s in standin_debs.standins(rehearsal=False)}
    assert by_name["nvidia-smi"] == v["nvidia_driver"] + "-1"
    assert by_name["nvidia-kernel-open-dkms"] == v["nvidia_driver"] + "-1"
    assert by_name["nvidia-fabricmanager"] == v["nvidia_fabricmanager"] + "-1"
    assert by_name["libnvidia-nscq"] == v["libnvidia_nscq"] + "-1"
    assert by_name["nvlsm"] == v["nvlsm"] + "-1"
    assert by_name["cuda-toolkit-" + str(v["cuda"]).replace(".", "-")].startswith(str(v["cuda"]) + ".")
    assert by_name["doca-ofed"] == v["doca"] + "-1"
    assert by_name["libgdrapi"] == v["gdrcopy"] + "-1"


def test_a_manifest_change_changes_names_versions_and_the_staging_key():
    v = dict(standin_debs.manifest(), nvidia_driver="580.105.08", cuda="13.1")
    assert "cuda-toolkit-13-1" in standin_debs.names(v)
    assert {s.version for s in standin_debs.standins(v) if s.name == "nvidia-smi"} == {"580.105.08-1"}
    assert standin_debs.fingerprint(v) != standin_debs.fingerprint()


def test_every_nvidia_package_the_roles_declare_for_debian_is_a_standin():
    declared = set()
    for role in HOST_STACK_ROLES:
        data = yaml.safe_load((ROOT / "roles" / role / "vars" / "Debian.yml").read_text())
        for key, value in data.items():
            if key.endswith("_packages"):
                declared.update(value)
    # infiniband-diags is real Debian; everything else the host stack installs is a stand-in.
    assert declared - standin_debs.names() == {"infiniband-diags"}


def test_built_debs_carry_the_real_names_and_the_emulator(tmp_path, dpkg_deb):
    debs = {p.name: p for p in standin_debs.build(tmp_path)}
    assert len(debs) == len(standin_debs.standins())
    smi = next(p for n, p in debs.items() if n.startswith("nvidia-smi_"))
    assert _field(smi, "Package") == "nvidia-smi"
    assert _field(smi, "Version") == standin_debs.manifest()["nvidia_driver"] + "-1"
    extract = tmp_path / "x"
    subprocess.run(["dpkg-deb", "-x", str(smi), str(extract)], check=True)
    shipped = extract / "usr/bin/nvidia-smi"
    # The emulator, with its own driver release baked in as its NVML library version.
    assert shipped.read_text() == standin_debs.FAKEGPU.read_text().replace(
        "LIBRARY_VERSION = None", "LIBRARY_VERSION = %r" % standin_debs.manifest()["nvidia_driver"])
    assert shipped.stat().st_mode & 0o111
    fm = next(p for n, p in debs.items() if n.startswith("nvidia-fabricmanager_"))
    listing = subprocess.run(["dpkg-deb", "-c", str(fm)], capture_output=True, text=True, check=True).stdout
    assert "./lib/systemd/system/nvidia-fabricmanager.service" in listing
    assert "./usr/bin/nv-fabricmanager" in listing


def test_the_store_also_carries_the_lab_rehearsal_driver_releases():
    """The driver upgrade rehearsal (playbooks/maintenance.yml) needs both releases in the store, and each
    release changes driver, fabric manager and nscq together."""
    rehearsal = standin_debs.rehearsal_driver_versions()
    assert rehearsal and standin_debs.manifest()["nvidia_driver"] not in rehearsal
    versions = {}
    for s in standin_debs.standins():
        versions.setdefault(s.name, set()).add(s.version)
    for name in ("nvidia-kernel-open-dkms", "nvidia-smi", "nvidia-fabricmanager", "libnvidia-nscq"):
        assert versions[name] == {standin_debs.manifest()["nvidia_driver"] + "-1"} | {d + "-1" for d in rehearsal}
    assert len({s.filename for s in standin_debs.standins()}) == len(standin_debs.standins())


def _module_files(tmp_path, s):
    """A stand-in package's files under tmp_path, its paths rewritten to stay there."""
    out = {}
    for path, (text, _mode) in s.files.items():
        target = tmp_path / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        # (The daemons it looks for are this test's, not the lab hosts' that this machine also sees.)
        target.write_text(text.replace(standin_debs.MODULE_DIR, str(tmp_path / "module"))
                          .replace('"/usr/bin/$daemon"', '"%s/usr/bin/$daemon"' % tmp_path))
        target.chmod(0o755)
        out[path] = target
    return out


def test_the_kernel_module_standin_loads_once_and_unloads(tmp_path):
    dkms = next(s for s in standin_debs.standins() if s.name == "nvidia-kernel-open-dkms")
    script = _module_files(tmp_path, dkms)["/usr/lib/pdctl-lab/nvidia-modules"]
    version = tmp_path / "module" / "version"
    subprocess.run([str(script), "load"], check=True, capture_output=True)
    assert version.read_text().strip() == standin_debs.manifest()["nvidia_driver"]
    version.write_text("580.1.1\n")  # another release loaded: a second load (modprobe) leaves it
    subprocess.run([str(script), "load"], check=True, capture_output=True)
    assert version.read_text().strip() == "580.1.1"
    subprocess.run([str(script), "unload"], check=True, capture_output=True)
    assert not version.exists()
    assert "pdctl-lab-nvidia-modules.service" in dkms.postinst


def test_fabric_manager_standin_reports_its_version_and_the_profile_fault(tmp_path):
    fm = next(s for s in standin_debs.standins() if s.name == "nvidia-fabricmanager")
    lib = tmp_path / "lib"
    lib.mkdir()
    # The package's files, where the packages put them: the emulator module beside the script.
    assert standin_debs.FAKEGPU_MODULE in next(s for s in standin_debs.standins() if s.name == "nvidia-smi").files
    shutil.copy(standin_debs.FAKEGPU, lib / "pdctl_fakegpu.py")
    (tmp_path / "fm").write_text(fm.files["/usr/bin/nv-fabricmanager"][0])
    profile = tmp_path / "profile.json"
    env = {"PDCTL_HW_PROFILE": str(profile), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(lib)}
    profile.write_text('{}')
    out = subprocess.run(["python3", str(tmp_path / "fm"), "--version"], capture_output=True, text=True, check=True,
                         env=env).stdout
    assert out.strip() == "Fabric Manager version is : " + standin_debs.manifest()["nvidia_fabricmanager"]
    profile.write_text('{"faults": {"fabric_manager_version": "580.82.07"}}')
    out = subprocess.run(["python3", str(tmp_path / "fm"), "--version"], capture_output=True, text=True, check=True,
                         env=env).stdout
    assert out.strip() == "Fabric Manager version is : 580.82.07"
    # Started against a driver module of another release (none loaded here), it refuses, as the real one does.
    res = subprocess.run(["python3", str(tmp_path / "fm")], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 1 and "not compatible with the loaded NVIDIA driver None" in res.stderr


def _declared_by_the_roles():
    """Read independently of the store: every `*_packages` list in roles/*/vars/Debian*.yml."""
    declared = set()
    for path in (ROOT / "roles").glob("*/vars/Debian*.yml"):
        for key, value in (yaml.safe_load(path.read_text()) or {}).items():
            if key.endswith("_packages"):
                declared.update(value)
    return declared


def test_store_stages_every_declared_package_and_resolves_only_the_real_ones(tmp_path, monkeypatch, dpkg_deb):
    """stage_apt with the Debian root and apt-get replaced: what it asks Debian for, what it indexes."""
    requires.binary("apt-ftparchive", "the lab's flat apt repository is indexed with apt-ftparchive (package apt-utils)")
    root = tmp_path / "rootfs"
    monkeypatch.setattr(store.image, "base_rootfs", lambda: root)
    monkeypatch.setattr(store.image, "cache_dir", lambda: tmp_path / "cache")
    (tmp_path / "cache").mkdir()
    asked = []
    real_run = subprocess.run

    def run(argv, *args, **kwargs):
        if argv[0] != "chroot":
            return real_run(argv, *args, **kwargs)
        # `chroot ROOT apt-get install --download-only ... PACKAGES`: download one minimal .deb per package.
        packages = [a for a in argv[argv.index("install") + 1:] if not a.startswith("-") and "=" not in a]
        asked.extend(packages)
        for name in packages:
            pkg = tmp_path / "debs" / name
            (pkg / "DEBIAN").mkdir(parents=True)
            (pkg / "DEBIAN" / "control").write_text(
                "Package: %s\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n" % name)
            real_run(["dpkg-deb", "--build", str(pkg), str(root / "var/cache/pdctl-stage" / (name + "_1.0_all.deb"))],
                     check=True, capture_output=True)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(store.subprocess, "run", run)
    (tmp_path / "store").mkdir()
    target = store.stage_apt(tmp_path / "store")
    declared = _declared_by_the_roles()
    standins = standin_debs.names()
    assert sorted(asked) == sorted(declared - standins)  # Debian is asked only for what is not a stand-in
    assert asked and declared & standins
    indexed = {}
    for stanza in (target / "Packages").read_text().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line[0].isspace())
        if fields:
            indexed.setdefault(fields["Package"], set()).add(fields["Version"])
    assert declared <= set(indexed), "declared but not staged: %s" % sorted(declared - set(indexed))
    for s in standin_debs.standins():
        assert s.version in indexed[s.name], s.name  # the stand-in, not a Debian package of that name
    assert (target / "Release").is_file()
