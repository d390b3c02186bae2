"""Lab stand-ins for the GPU host stack: .debs with the real package names and the manifest's versions.

The lab hosts have no GPUs, NICs or kernel access, and NVIDIA's and DOCA's repositories are not
reachable. So the controller builds, with dpkg-deb, one small package for each real one the host
stack roles install on Debian (roles/{nvidia_driver,nvidia_fabric,cuda_toolkit,rdma}/vars/Debian.yml):
same name, version from THE versions manifest (inventories/b300/group_vars/all/versions.yml), and
content that behaves well enough in a systemd container:

- nvidia-smi ships the lab GPU emulator (src/pdctl/lab/fakegpu/nvidia_smi.py) as /usr/bin/nvidia-smi;
  it reads the host's hardware profile (/etc/pdctl/hw-profile.json, written by the bench's lab_hardware:
  src/pdctl/lab/ansible, `pdctl-lab up` / `pdctl-lab hardware`).
- nvidia-fabricmanager ships nv-fabricmanager (reports the profile's fabric manager version, then
  idles), nvidia-fabricmanager-start.sh and a service unit that runs in a container.
- nvidia-persistenced ships an idle daemon and its unit; the rest carry only a README.
- datacenter-gpu-manager-exporter ships the DCGM exporter stand-in (src/pdctl/lab/fakegpu/dcgm_exporter.py) as
  /usr/bin/dcgm-exporter and a nvidia-dcgm-exporter unit: the counters file's fields for the emulated GPUs.

store.stage_apt excludes these names from the Debian resolution and adds the .debs to the flat repo.
"""
from __future__ import annotations

import hashlib
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pdctl import collection

FAKEGPU = Path(__file__).resolve().parent / "fakegpu" / "nvidia_smi.py"
DCGM_EXPORTER = Path(__file__).resolve().parent / "fakegpu" / "dcgm_exporter.py"
# The emulator is also a module on the hosts' Python path, as a Debian package installs one.
FAKEGPU_MODULE = "/usr/lib/python3/dist-packages/pdctl_fakegpu.py"
# Where the kernel module stand-in writes the version it loaded (nvidia_smi.MODULE_VERSION_FILE's directory).
MODULE_DIR = "/run/pdctl-lab/sys/module/nvidia"
MAINTAINER = "pdctl-lab <pdctl-lab@localhost>"
DEB_REVISION = "1"


@dataclass
class Standin:
    name: str
    version: str
    description: str
    files: dict = field(default_factory=dict)  # absolute path -> (text, mode)
    depends: str = ""
    postinst: str = ""

    @property
    def filename(self) -> str:
        return "%s_%s_all.deb" % (self.name, self.version)


def manifest_path() -> Path:
    return collection.root() / "inventories" / "b300" / "group_vars" / "all" / "versions.yml"


def manifest() -> dict:
    return yaml.safe_load(manifest_path().read_text())["pdctl_versions"]


def _readme(name: str) -> dict:
    text = ("%s: pdctl-lab stand-in. The lab hosts have no GPUs or kernel access; this package only\n"
            "carries the real package's name and version so the roles install it as in production.\n" % name)
    return {"/usr/share/doc/%s/README.pdctl-lab" % name: (text, 0o644)}


_PERSISTENCED = """#!/bin/sh
# pdctl-lab stand-in for nvidia-persistenced: no GPUs to hold open. Like the real daemon it leaves
# persistence mode on unless started with --no-persistence-mode, and off when it stops; the GPU
# emulator (nvidia-smi) reports what it left in the state file.
mode=Enabled
for arg in "$@"; do
  case "$arg" in
    --no-persistence-mode) mode=Disabled ;;
    --persistence-mode) mode=Enabled ;;
  esac
done
state=/run/nvidia-persistenced/pdctl-lab-persistence-mode
mkdir -p /run/nvidia-persistenced
echo "$mode" > "$state"
echo "nvidia-persistenced (pdctl-lab stand-in) started: $* (persistence mode $mode)"
trap 'echo Disabled > "$state"; exit 0' TERM INT
sleep infinity &
wait $!
"""

# As Ubuntu packages it: the unit runs the daemon with --no-persistence-mode (the roles override it).
_PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon (pdctl-lab stand-in)

[Service]
Type=simple
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose

[Install]
WantedBy=multi-user.target
"""

_NV_FABRICMANAGER = """#!/usr/bin/python3
\"\"\"pdctl-lab stand-in for nv-fabricmanager: reports the fabric manager version of the host's
hardware profile (faults.fabric_manager_version wins, to inject a skew), otherwise idles.\"\"\"
import signal
import sys

from pdctl_fakegpu import MODULE_VERSION_FILE, load_profile


PACKAGE_VERSION = "%s"


def version():
    return (load_profile().get("faults") or {}).get("fabric_manager_version") or PACKAGE_VERSION


if "--version" in sys.argv or "-v" in sys.argv:
    print("Fabric Manager version is : " + version())
    sys.exit(0)
# Like the real one: it runs only against the driver release it belongs to.
try:
    with open(MODULE_VERSION_FILE, encoding="utf-8") as handle:
        module = handle.read().strip()
except FileNotFoundError:
    module = None
if module != version():
    print("fabric manager version %%s is not compatible with the loaded NVIDIA driver %%s" %% (version(), module),
          file=sys.stderr, flush=True)
    sys.exit(1)
print("nv-fabricmanager (pdctl-lab stand-in) %%s started with %%s" %% (version(), " ".join(sys.argv[1:])), flush=True)
print("Successfully configured all the available NVSwitches to route GPU NVLink traffic.", flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
signal.pause()
"""

_FM_START = """#!/bin/sh
# pdctl-lab stand-in for nvidia-fabricmanager-start.sh: the real one detects NVLink 5 (an IB device
# whose VPD holds SW_MNG), starts NVLSM, then nv-fabricmanager. Here: log the mode and run the stand-in.
set -eu
echo "nvidia-fabricmanager-start.sh (pdctl-lab stand-in): $*"
exec /usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg
"""

_FM_UNIT = """[Unit]
Description=NVIDIA fabric manager service (pdctl-lab stand-in)
After=network-online.target

[Service]
Type=simple
ExecStart=/usr/bin/nvidia-fabricmanager-start.sh --mode start --fm-config-file /usr/share/nvidia/nvswitch/fabricmanager.cfg --nvlsm-config-file /usr/share/nvidia/nvlsm/nvlsm.conf
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""

# The kernel module: what nvidia-kernel-open-dkms installs is what the host loads at boot (the unit
# below, on tmpfs where /sys/module/nvidia/version would be), or on a fresh host at install time, as
# `modprobe nvidia` does; a module already loaded stays until a reboot or a reload (restart the unit).
_MODULES = """#!/bin/sh
# pdctl-lab stand-in for loading and unloading the NVIDIA kernel module %(version)s.
set -eu
dir=%(dir)s
case "${1:-load}" in
  load)
    [ -e "$dir/version" ] && exit 0  # modprobe of a loaded module: nothing happens
    mkdir -p "$dir"
    echo %(version)s > "$dir/version"
    echo "nvidia: module %(version)s loaded" ;;
  unload)
    for daemon in nv-fabricmanager nvidia-persistenced; do
      if pgrep -f "/usr/bin/$daemon" > /dev/null; then
        echo "modprobe: FATAL: Module nvidia is in use ($daemon runs)." >&2
        exit 1
      fi
    done
    rm -f "$dir/version"
    echo "nvidia: module unloaded" ;;
esac
"""

_MODULES_UNIT = """[Unit]
Description=NVIDIA kernel module (pdctl-lab stand-in)
DefaultDependencies=no
Before=nvidia-persistenced.service nvidia-fabricmanager.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/lib/pdctl-lab/nvidia-modules load
ExecStop=/usr/lib/pdctl-lab/nvidia-modules unload

[Install]
WantedBy=multi-user.target
"""

# A fresh host loads the module it installs; an upgrade only installs it (the old one stays loaded).
_MODULES_POSTINST = """#!/bin/sh
set -e
if [ "$1" = configure ]; then
  systemctl enable pdctl-lab-nvidia-modules.service >/dev/null 2>&1 || true
  [ -e %(dir)s/version ] || systemctl start pdctl-lab-nvidia-modules.service || /usr/lib/pdctl-lab/nvidia-modules load
fi
"""

_NVLSM = """#!/bin/sh
# pdctl-lab stand-in for the NVLink subnet manager (started by nvidia-fabricmanager-start.sh on NVLink 5).
echo "nvlsm (pdctl-lab stand-in) %s"
"""

_NVCC = """#!/bin/sh
# pdctl-lab stand-in for nvcc: reports the toolkit release it belongs to.
echo "nvcc: NVIDIA (R) Cuda compiler driver"
echo "Cuda compilation tools, release %s, V%s"
"""


# As NVIDIA's datacenter-gpu-manager-exporter ships it: the unit runs the exporter with its default counters
# file (roles/monitoring points it at pdctl's with a drop-in). The default list, like the real one, leaves the
# ECC and NVLink error counters out.
_DCGM_EXPORTER_UNIT = """[Unit]
Description=NVIDIA DCGM exporter (pdctl-lab stand-in)
After=network-online.target

[Service]
Type=simple
ExecStart=/usr/bin/dcgm-exporter
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""

_DCGM_DEFAULT_COUNTERS = """# pdctl-lab stand-in: dcgm-exporter's default list, which leaves the ECC and NVLink error counters out.
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.
# DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.
# DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, counter, Total number of NVLink flow-control CRC errors.
"""


def rehearsal_driver_versions() -> list[str]:
    """Other driver releases the lab's store carries (the driver upgrade rehearsal of playbooks/maintenance.yml):
    pdctl_lab_driver_rehearsal_versions in the lab inventory."""
    path = collection.root() / "inventories" / "lab" / "group_vars" / "all" / "lab_hardware.yml"
    return [str(v) for v in yaml.safe_load(path.read_text()).get("pdctl_lab_driver_rehearsal_versions") or []]


def driver_standins(drv: str, fm: str, nscq: str) -> list[Standin]:
    """One driver release: what changes together (driver == fabric manager == nscq)."""
    rev = "-" + DEB_REVISION
    smi = FAKEGPU.read_text().replace("LIBRARY_VERSION = None", "LIBRARY_VERSION = %r" % drv, 1)
    module = {"version": drv, "dir": MODULE_DIR}
    return [
        Standin("nvidia-kernel-open-dkms", drv + rev, "NVIDIA open GPU kernel modules (DKMS)",
                {"/usr/lib/pdctl-lab/nvidia-modules": (_MODULES % module, 0o755),
                 "/lib/systemd/system/pdctl-lab-nvidia-modules.service": (_MODULES_UNIT, 0o644),
                 **_readme("nvidia-kernel-open-dkms")},
                postinst=_MODULES_POSTINST % module),
        Standin("libcuda1", drv + rev, "NVIDIA CUDA driver library", _readme("libcuda1")),
        Standin("nvidia-smi", drv + rev, "NVIDIA System Management Interface (lab GPU emulator)",
                {"/usr/bin/nvidia-smi": (smi, 0o755), FAKEGPU_MODULE: (smi, 0o644)},
                depends="python3"),
        Standin("nvidia-persistenced", drv + rev, "NVIDIA persistence daemon",
                {"/usr/bin/nvidia-persistenced": (_PERSISTENCED, 0o755),
                 "/lib/systemd/system/nvidia-persistenced.service": (_PERSISTENCED_UNIT, 0o644)}),
        Standin("nvidia-fabricmanager", fm + rev, "NVIDIA fabric manager",
                {"/usr/bin/nv-fabricmanager": (_NV_FABRICMANAGER % fm, 0o755),
                 "/usr/bin/nvidia-fabricmanager-start.sh": (_FM_START, 0o755),
                 "/usr/share/nvidia/nvswitch/fabricmanager.cfg": ("LOG_LEVEL=4\nDAEMONIZE=0\nFABRIC_MODE=0\n", 0o644),
                 "/lib/systemd/system/nvidia-fabricmanager.service": (_FM_UNIT, 0o644)},
                depends="nvidia-smi, python3"),
        Standin("libnvidia-nscq", nscq + rev, "NVIDIA NVSwitch configuration and query library",
                _readme("libnvidia-nscq")),
    ]


def standins(versions: dict | None = None, rehearsal: bool = True) -> list[Standin]:
    """The stand-in packages for a versions manifest (default: THE manifest), and (rehearsal) the driver
    packages of the lab's other driver releases."""
    v = versions or manifest()
    nvlsm = v["nvlsm"]
    cuda = str(v["cuda"])
    cuda_full = cuda + ".0" if cuda.count(".") == 1 else cuda
    rev = "-" + DEB_REVISION
    others = [d for d in rehearsal_driver_versions() if d != v["nvidia_driver"]] if rehearsal else []
    return driver_standins(v["nvidia_driver"], v["nvidia_fabricmanager"], v["libnvidia_nscq"]) + [
        s for d in others for s in driver_standins(d, d, d)] + [
        Standin("nvlsm", nvlsm + rev, "NVIDIA NVLink subnet manager",
                {"/usr/sbin/nvlsm": (_NVLSM % nvlsm, 0o755),
                 "/usr/share/nvidia/nvlsm/nvlsm.conf": ("# pdctl-lab stand-in\n", 0o644)}),
        Standin("cuda-toolkit-" + cuda.replace(".", "-"), cuda_full + rev, "CUDA Toolkit " + cuda,
                {"/usr/local/cuda-%s/bin/nvcc" % cuda: (_NVCC % (cuda, cuda_full), 0o755)}),
        Standin("doca-ofed", v["doca"] + rev, "DOCA-OFED (ConnectX drivers and RDMA user space)",
                _readme("doca-ofed")),
        Standin("gdrdrv-dkms", v["gdrcopy"] + rev, "GDRCopy kernel module (DKMS)", _readme("gdrdrv-dkms")),
        Standin("libgdrapi", v["gdrcopy"] + rev, "GDRCopy user-space library", _readme("libgdrapi")),
        Standin("datacenter-gpu-manager-exporter", v["dcgm_exporter"] + rev, "NVIDIA DCGM exporter (lab GPU emulator)",
                {"/usr/bin/dcgm-exporter": (DCGM_EXPORTER.read_text(), 0o755),
                 "/etc/dcgm-exporter/default-counters.csv": (_DCGM_DEFAULT_COUNTERS, 0o644),
                 "/lib/systemd/system/nvidia-dcgm-exporter.service": (_DCGM_EXPORTER_UNIT, 0o644)},
                depends="nvidia-smi, python3"),
    ]


def names(versions: dict | None = None) -> set[str]:
    return {s.name for s in standins(versions)}


def fingerprint(versions: dict | None = None) -> str:
    """Changes whenever a stand-in's name, version or content would (staging cache key)."""
    h = hashlib.sha256()
    for s in standins(versions):
        h.update(("%s\0%s\0%s\0%s\0%s\0" % (s.name, s.version, s.depends, s.description, s.postinst)).encode())
        for path, (text, mode) in sorted(s.files.items()):
            h.update(("%s\0%o\0%s\0" % (path, mode, text)).encode())
    return h.hexdigest()[:12]


def _control(s: Standin) -> str:
    lines = ["Package: " + s.name, "Version: " + s.version, "Architecture: all", "Maintainer: " + MAINTAINER,
             "Section: misc", "Priority: optional"]
    if s.depends:
        lines.append("Depends: " + s.depends)
    lines.append("Description: %s (pdctl-lab stand-in)" % s.description)
    lines.append(" Same name and version as the real package; lab hosts only.")
    return "\n".join(lines) + "\n"


def build_one(s: Standin, dest: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="pdctl-standin-") as tmp:
        root = Path(tmp) / s.name
        (root / "DEBIAN").mkdir(parents=True)
        (root / "DEBIAN" / "control").write_text(_control(s))
        if s.postinst:
            (root / "DEBIAN" / "postinst").write_text(s.postinst)
            (root / "DEBIAN" / "postinst").chmod(0o755)
        for path, (text, mode) in s.files.items():
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            target.chmod(mode)
        out = dest / s.filename
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(out)],
                       check=True, stdout=subprocess.DEVNULL)
    return out


def build(dest: Path, versions: dict | None = None) -> list[Path]:
    """Build every stand-in .deb into dest; return their paths."""
    dest.mkdir(parents=True, exist_ok=True)
    return [build_one(s, dest) for s in standins(versions)]
