"""The lab's three test hosts: systemd containers on a private podman network, reached over SSH.

`pdctl-lab up` builds a Debian 12 image once (mmdebstrap, cached by content), stages the lab's
artifact store, starts one container per host in inventories/lab, and waits until each answers
SSH. It detects this machine's container quirks (cgroup v1 needs runc; no CAP_SYS_RESOURCE needs
explicit rlimits at or below the hard limits) instead of hard-coding them.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import resource
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pdctl import collection
from pdctl.lab import image, stage, store

NETWORK = "pdctl-lab"
SUBNET = "10.89.64.0/24"
ADMIN_USER = "pdctl-admin"
LABEL = "io.pdctl.lab=1"
CAP_SYS_RESOURCE = 24
MODEL_MOUNT = "/mnt/model"
# What the hosts need beyond the machine's quirks: NET_ADMIN for nftables (roles/firewall) in the
# container's own network namespace; NET_RAW for keepalived (roles/frontdoor_vip: its raw socket for IP
# protocol 112, VRRP, and the packet socket of its gratuitous ARP fail with EPERM without it); a reboot
# (systemd exits, `shutdown -r`) starts the host again, with a fresh /run, as a server comes back (the
# driver upgrade of playbooks/maintenance.yml reboots).
HOST_OPTIONS = ["--cap-add", "NET_ADMIN", "--cap-add", "NET_RAW", "--restart", "always"]
OPTIONS_LABEL = "io.pdctl.lab.options"


@dataclass
class LabHost:
    name: str
    address: str


def lab_dir() -> Path:
    d = collection.root() / ".lab"
    d.mkdir(exist_ok=True)
    return d


def inventory_path() -> Path:
    return collection.root() / "inventories" / "lab"


def lab_hosts(inventory_dir: Path | None = None) -> list[LabHost]:
    from pdctl import inventory

    hosts = inventory.load(inventory_dir or inventory_path())
    return [LabHost(name, str(h["vars"]["ansible_host"])) for name, h in sorted(hosts.items())]


def step(msg: str):
    print("lab: %s" % msg, flush=True)


def run(cmd, check=True, capture=True, **kw):
    res = subprocess.run(cmd, text=True, capture_output=capture, **kw)
    if check and res.returncode != 0:
        raise LabError("%s failed (exit %d): %s" % (" ".join(map(str, cmd[:4])), res.returncode,
                                                    (res.stderr or res.stdout or "").strip()[-2000:]))
    return res


class LabError(Exception):
    pass


# -- quirk detection ------------------------------------------------------------------------

def _cgroup_v2_only() -> bool:
    return Path("/sys/fs/cgroup/cgroup.controllers").exists()


UNIFIED_HIERARCHY = "/sys/fs/cgroup/unified"


def _unified_hierarchy_mounted() -> bool:
    """A cgroup v1 'hybrid' host: the cgroup2 hierarchy is mounted beside the v1 controllers."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] == UNIFIED_HIERARCHY and " - cgroup2 " in line:
            return True
    return False


def _has_capability(bit: int) -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


def container_options() -> list[str]:
    """podman run options this machine needs (empty on a normal cgroup-v2 workstation)."""
    opts = []
    if not _cgroup_v2_only():
        # crun refuses cgroup v1/hybrid hosts ("cgroups in hybrid mode not supported").
        if not shutil.which("runc"):
            raise LabError("this machine uses cgroup v1 and needs the runc runtime: apt-get install runc")
        opts += ["--runtime", "runc"]
        if _unified_hierarchy_mounted():
            # systemd in the container learns that a unit's cgroup is empty only from the cgroup2
            # hierarchy (cgroup.events); without it a crashed unit stays "deactivating" until its
            # stop timeout and Restart= fires minutes late. The container sees the hierarchy at the
            # same path as the host (no cgroup namespace), as it already sees name=systemd.
            opts += ["-v", "%s:%s:rw" % (UNIFIED_HIERARCHY, UNIFIED_HIERARCHY)]
    if not _has_capability(CAP_SYS_RESOURCE):
        # Without CAP_SYS_RESOURCE runc cannot raise rlimits: ask for no more than the hard limits.
        for name, res_id, wanted in (("nofile", resource.RLIMIT_NOFILE, 16384), ("nproc", resource.RLIMIT_NPROC, 8192)):
            hard = resource.getrlimit(res_id)[1]
            value = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            opts += ["--ulimit", "%s=%d:%d" % (name, value, value)]
    return opts


# -- lifecycle ---------------------------------------------------------------------------------

def _ssh_key() -> Path:
    key = lab_dir() / "ssh" / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(mode=0o700, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "pdctl-lab", "-f", str(key)])
    return key


def _container_state(name: str) -> str | None:
    res = run(["podman", "container", "inspect", "--format", "{{.State.Status}}", name], check=False)
    return res.stdout.strip() if res.returncode == 0 else None


def _container_label(name: str, label: str) -> str:
    res = run(["podman", "container", "inspect", "--format", '{{index .Config.Labels "%s"}}' % label, name],
              check=False)
    return res.stdout.strip()


def _container_lab_dir(name: str) -> str:
    return _container_label(name, "io.pdctl.lab.dir")


def options_digest(opts: list[str]) -> str:
    """Fingerprint of the options a host container runs with: a running host started with other
    options (e.g. before a capability was added) is started anew."""
    return hashlib.sha256("\0".join(opts).encode()).hexdigest()[:12]


def _ensure_network():
    if run(["podman", "network", "exists", NETWORK], check=False).returncode != 0:
        run(["podman", "network", "create", "--subnet", SUBNET, "--label", LABEL, NETWORK])


def _wait_ssh(host: LabHost, key: Path, known_hosts: Path, timeout: float = 90):
    deadline = time.monotonic() + timeout
    cmd = ["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "ConnectTimeout=3",
           "-o", "StrictHostKeyChecking=accept-new", "-o", "UserKnownHostsFile=%s" % known_hosts,
           "%s@%s" % (ADMIN_USER, host.address), "sudo -n true"]
    while True:
        res = run(cmd, check=False)
        if res.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise LabError("%s (%s) does not answer SSH after %ds: %s"
                           % (host.name, host.address, timeout, res.stderr.strip()[-500:]))
        time.sleep(1)


def up(inventory_dir: Path | None = None) -> int:
    """Start the hosts of the lab inventory (or of another inventory on the lab network, e.g. molecule's).

    Two at once take turns (molecule's create beside the lab tests' own fixture): they share the
    image, the network, the store and the staged files, which each checks and makes."""
    with open(lab_dir() / "up.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _up(inventory_dir)


def _up(inventory_dir: Path | None) -> int:
    t0 = time.monotonic()
    try:
        for tool in ("podman", "mmdebstrap", "ssh", "ssh-keygen"):
            if not shutil.which(tool):
                raise LabError("%s is not installed (run scripts/bootstrap)" % tool)
        hosts = lab_hosts(inventory_dir)
        opts = container_options() + HOST_OPTIONS
        step("container options for this machine: %s" % (" ".join(opts) or "none needed"))
        key = _ssh_key()
        timings = {}
        # The wheelhouse (pip downloads, the stand-in's wheel) needs neither the image nor the hosts: on a
        # cold cache it is staged beside the image build, which mostly waits on the Debian mirror.
        pool = ThreadPoolExecutor(max_workers=1)
        wheels = pool.submit(_seconds, stage.ensure_wheels, lab_dir(), inventory_path())
        pool.shutdown(wait=False)
        t = time.monotonic()
        tag = image.ensure(opts)
        timings["image"] = time.monotonic() - t
        _ensure_network()
        known_hosts = lab_dir() / "ssh" / "known_hosts"
        digest = options_digest(opts)
        started = []
        for host in hosts:
            state = _container_state(host.name)
            # A host started from another checkout trusts that checkout's key, and one started with other
            # options lacks what the roles rely on (a capability): start it anew.
            if (state == "running" and _container_lab_dir(host.name) == str(lab_dir())
                    and _container_label(host.name, OPTIONS_LABEL) == digest):
                continue
            if state is not None:
                # Replaced, not shut down: without -t 0 podman waits out its 10 s stop timeout per host
                # (systemd stops the serving units, whose drain allows minutes) before it kills.
                run(["podman", "rm", "-f", "-t", "0", host.name])
            # A real filesystem at the model path, as production hosts have (NVMe array at /mnt/model).
            model_volume = lab_dir() / "volumes" / host.name / "model"
            model_volume.mkdir(parents=True, exist_ok=True)
            run(["podman", "run", "-d", "--name", host.name, "--hostname", host.name,
                 "--label", LABEL, "--label", "io.pdctl.lab.dir=%s" % lab_dir(),
                 "--label", "%s=%s" % (OPTIONS_LABEL, digest),
                 "--network", NETWORK, "--ip", host.address, "--systemd", "always",
                 *opts,
                 "-v", "%s.pub:/home/%s/.ssh/authorized_keys:ro,Z" % (key, ADMIN_USER),
                 "-v", "%s:%s:Z" % (model_volume, MODEL_MOUNT),
                 tag, "/sbin/init"])
            started.append(host.name)
        if started:
            step("started %s" % ", ".join(started))
            for host in hosts:
                if host.name in started:
                    _forget_host_key(host)  # a new container has new host keys
        timings["hosts"] = time.monotonic() - t - timings["image"]
        # The store binds to the network's gateway, which exists once a container is attached.
        t = time.monotonic()
        store.ensure_started(lab_dir())
        timings["apt"] = time.monotonic() - t
        t = time.monotonic()
        timings["wheelhouse"] = wheels.result()  # its own seconds, beside the image
        timings["wheelhouse_wait"] = time.monotonic() - t  # what the bring-up waited for it afterwards
        timings.update(stage.stage_all(lab_dir(), inventory_path(), store.GATEWAY))
        t = time.monotonic()
        for host in hosts:
            _wait_ssh(host, key, known_hosts)
        timings["hosts"] += time.monotonic() - t
        # Where the time of a cold bring-up went (read by .ci/run's phase table).
        (lab_dir() / "up-timings.json").write_text(json.dumps({k: round(v, 1) for k, v in timings.items()}))
        step("%d hosts up in %.1fs: %s" % (len(hosts), time.monotonic() - t0,
                                          ", ".join("%s=%s" % (h.name, h.address) for h in hosts)))
        return 0
    except LabError as exc:
        print("pdctl-lab up: %s" % exc, file=sys.stderr)
        return 1


def _seconds(step, *args) -> float:
    t0 = time.monotonic()
    step(*args)
    return time.monotonic() - t0


def down(inventory_dir: Path | None = None) -> int:
    """Remove the inventory's hosts; the network and the store go with the last lab host."""
    for host in lab_hosts(inventory_dir):
        if _container_state(host.name) is not None:
            run(["podman", "rm", "-f", "-t", "5", host.name])
            step("removed %s" % host.name)
        shutil.rmtree(lab_dir() / "volumes" / host.name, ignore_errors=True)
        _forget_host_key(host)
    remaining = run(["podman", "ps", "-a", "-q", "--filter", "label=" + LABEL]).stdout.split()
    if remaining:
        step("%d other lab container(s) still running: network and artifact store kept" % len(remaining))
        return 0
    if run(["podman", "network", "exists", NETWORK], check=False).returncode == 0:
        run(["podman", "network", "rm", NETWORK])
    store.stop(lab_dir())
    stage.stop_all(lab_dir())
    step("down (the image stays cached; `podman image rm` it to rebuild)")
    return 0


def _forget_host_key(host: LabHost):
    known_hosts = lab_dir() / "ssh" / "known_hosts"
    if known_hosts.exists():
        run(["ssh-keygen", "-R", host.address, "-f", str(known_hosts)], check=False)


def status(inventory_dir: Path | None = None) -> int:
    rows = [("HOST", "ADDRESS", "CONTAINER", "SYSTEMD")]
    all_running = True
    for host in lab_hosts(inventory_dir):
        state = _container_state(host.name) or "absent"
        systemd = "-"
        if state == "running":
            res = run(["podman", "exec", host.name, "systemctl", "is-system-running"], check=False)
            systemd = res.stdout.strip() or "unknown"
        all_running &= state == "running"
        rows.append((host.name, host.address, state, systemd))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip())
    print("artifact store: %s" % store.describe(lab_dir()))
    return 0 if all_running else 3
