"""The lab's Debian 12 systemd image, built once with mmdebstrap and cached by content.

No container registry is reachable, so the image is made from a Debian root filesystem
(`podman import`). mmdebstrap (Debian's own package) downloads and unpacks in parallel: 42-48 s
against debootstrap's 99 s for the same packages from the same mirror. The pristine root stays in the cache: the artifact store resolves the Debian
packages the roles install against it (see store.stage_apt), exactly as the hosts will see them.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from pdctl import cache

SUITE = "bookworm"
INCLUDE = ["systemd", "systemd-sysv", "dbus", "python3", "python3-apt", "sudo", "openssh-server",
           "iproute2", "procps", "ca-certificates", "less"]

# Applied inside the copied root: the admin user Ansible logs in as, per-container SSH host keys,
# no apt sources (hosts install from the controller's artifact store only, as air-gapped sites do).
CUSTOMIZE = r"""
set -eu
useradd --create-home --shell /bin/bash pdctl-admin
install -d -m 0700 -o pdctl-admin -g pdctl-admin /home/pdctl-admin/.ssh
echo 'pdctl-admin ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/pdctl-admin
chmod 0440 /etc/sudoers.d/pdctl-admin
printf 'PasswordAuthentication no\nUseDNS no\nHostKey /etc/ssh/ssh_host_ed25519_key\n' > /etc/ssh/sshd_config.d/pdctl-lab.conf
rm -f /etc/ssh/ssh_host_*
# One Ed25519 host key per container, made at its first boot: `ssh-keygen -A` also makes an RSA key,
# which took 6.5 of a host's 7 s boot.
cat > /usr/local/sbin/pdctl-lab-hostkey <<'KEY'
#!/bin/sh
[ -e /etc/ssh/ssh_host_ed25519_key ] || exec ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key
KEY
chmod 0755 /usr/local/sbin/pdctl-lab-hostkey
mkdir -p /etc/systemd/system/ssh.service.d
printf '[Service]\nExecStartPre=\nExecStartPre=/usr/local/sbin/pdctl-lab-hostkey\nExecStartPre=/usr/sbin/sshd -t\n' > /etc/systemd/system/ssh.service.d/hostkeys.conf
rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id
"""


def cache_dir() -> Path:
    return cache.cache_dir("lab")


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (override: PDCTL_LAB_DEBIAN_MIRROR)."""
    env = os.environ.get("PDCTL_LAB_DEBIAN_MIRROR")
    if env:
        return env
    candidates = sorted(Path("/etc/apt/sources.list.d").glob("*.sources")) + [Path("/etc/apt/sources.list")]
    for path in candidates:
        if not path.is_file():
            continue
        text = path.read_text()
        for stanza in re.split(r"\n\s*\n", text):
            if re.search(r"^Suites:.*\b%s\b" % SUITE, stanza, re.M):
                m = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
                if m and "security" not in m.group(1):
                    return m.group(1)
        m = re.search(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+%s\s" % SUITE, text, re.M)
        if m:
            return m.group(1)
    raise RuntimeError("cannot find a Debian %s mirror in /etc/apt; set PDCTL_LAB_DEBIAN_MIRROR" % SUITE)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def base_rootfs() -> Path:
    """Pristine Debian root (with apt lists), built once."""
    key = _digest("mmdebstrap", SUITE, ",".join(INCLUDE))
    root = cache_dir() / ("rootfs-" + key)
    if (root / ".complete").exists():
        return root
    if root.exists():
        shutil.rmtree(root)
    mirror = debian_mirror()
    t0 = time.monotonic()
    print("lab: mmdebstrap %s into %s (once; about a minute)" % (SUITE, root), flush=True)
    subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", "--include=" + ",".join(INCLUDE), SUITE, str(root),
                    mirror], check=True, stdout=subprocess.DEVNULL)
    shutil.copy("/etc/resolv.conf", root / "etc/resolv.conf")
    subprocess.run(["chroot", str(root), "apt-get", "update", "-qq"], check=True)
    (root / ".complete").write_text("built in %.0fs from %s\n" % (time.monotonic() - t0, mirror))
    return root


def ensure(container_opts: list[str]) -> str:
    """Return the tag of the lab image, building it if this content was never built."""
    root = base_rootfs()
    tag = "localhost/pdctl-lab:" + _digest(root.name, CUSTOMIZE)
    if subprocess.run(["podman", "image", "exists", tag]).returncode == 0:
        return tag
    t0 = time.monotonic()
    work = cache_dir() / "image-build"
    if work.exists():
        shutil.rmtree(work)
    subprocess.run(["cp", "-a", str(root), str(work)], check=True)
    (work / ".complete").unlink()
    subprocess.run(["chroot", str(work), "/bin/sh", "-c", CUSTOMIZE], check=True)
    tar = subprocess.Popen(["tar", "-C", str(work), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(["podman", "import", "--quiet", "-", tag], stdin=tar.stdout, check=True, stdout=subprocess.DEVNULL)
    if tar.wait() != 0:
        raise RuntimeError("tar of the lab root failed")
    shutil.rmtree(work)
    print("lab: built image %s in %.1fs" % (tag, time.monotonic() - t0), flush=True)
    return tag
