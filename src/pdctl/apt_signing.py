"""Signing the artifact store's apt repository (InRelease and Release.gpg), the way apt verifies it.

The hosts trust exactly one key for the store (`Signed-By:` in its sources file); a repository
whose Release does not verify against it is refused. The key lives in a GnuPG home of its own
(`<key_dir>/gnupg`, never the operator's); its public half is exported next to it as
`pdctl-store.asc` (what the inventory's `pdctl_artifact_store_signing_key` holds) and
`pdctl-store.gpg` (a binary keyring for gpgv).

    python -m pdctl.apt_signing key KEY_DIR            # make the key once (kept)
    python -m pdctl.apt_signing sign KEY_DIR REPO_DIR  # sign REPO_DIR/Release
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

PUBLIC_ASC = "pdctl-store.asc"
PUBLIC_GPG = "pdctl-store.gpg"
SIGNATURES = ("InRelease", "Release.gpg")
AGENT_IPC_ERRORS = ("End of file", "Broken pipe")


class SigningError(RuntimeError):
    pass


def _home(key_dir: Path) -> str:
    """The GnuPG home as gpg is given it. gpg-agent's sockets live in the home, and a Unix socket path
    may not exceed 107 bytes: a deep home (a checkout far down a tree, a test's tmp dir) is reached
    through a short, stable link in the temp directory instead."""
    home = (key_dir / "gnupg").resolve()
    if len(str(home)) <= 64:
        return str(home)
    link = Path(tempfile.gettempdir()) / ("pdctl-gnupg-" + hashlib.sha256(str(home).encode()).hexdigest()[:12])
    if not (link.is_symlink() and os.readlink(link) == str(home)):
        tmp = link.with_name(link.name + ".%d" % os.getpid())
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(home)
        os.replace(tmp, link)
    return str(link)


def _gpg(key_dir: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    home = _home(key_dir)
    if not shutil.which("gpg"):
        raise SigningError("gpg is not installed (scripts/bootstrap installs it; apt-get install gpg)")
    res = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--quiet", "--no-tty", *args],
                         capture_output=True, **kw)
    if res.returncode != 0:
        err = res.stderr if isinstance(res.stderr, str) else res.stderr.decode(errors="replace")
        raise SigningError("gpg %s failed (exit %d): %s" % (args[0], res.returncode, err.strip()[-1000:]))
    return res


def _stop_agent(key_dir: Path) -> None:
    # gpg starts an agent per home directory; leave none behind.
    subprocess.run(["gpgconf", "--homedir", _home(key_dir), "--kill", "gpg-agent"],
                   capture_output=True, check=False)


@contextlib.contextmanager
def session(key_dir: Path, name: str = "pdctl artifact store") -> Iterator[str]:
    """Hold the key directory for one run of gpg work: make the key once, yield its fingerprint, stop
    the agent after. The apt repository and the wheel locks are signed at once (`pdctl-lab up`
    stages the wheelhouse beside the store): without the lock around the whole session, one
    signer's agent stop kills the agent the other is signing with ("gpg-agent: End of file")."""
    key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (key_dir / "gnupg").mkdir(mode=0o700, exist_ok=True)
    with open(key_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield _ensure_key_locked(key_dir, name)
        finally:
            _stop_agent(key_dir)


def clearsign(key_dir: Path, fpr: str, source: Path, output: Path, *args: str) -> None:
    """Sign source into output with the key fpr (inside a session); args: --clearsign by default."""
    cmd = ("--local-user", fpr, "--digest-algo", "SHA512", *(args or ("--clearsign",)), "--output", str(output))
    try:
        _gpg(key_dir, *cmd, str(source))
    except SigningError as exc:
        # Seen twice on a loaded 2-core machine (lab up beside the unit tests): the agent connection
        # ends mid-request ("End of file", "Broken pipe"). Not reproduced alone; one retry with a
        # new agent, the output file written anew.
        if not any(word in str(exc) for word in AGENT_IPC_ERRORS):
            raise
        _stop_agent(key_dir)
        output.unlink(missing_ok=True)
        _gpg(key_dir, *cmd, str(source))


def fingerprint(key_dir: Path) -> str:
    out = _gpg(key_dir, "--with-colons", "--list-secret-keys", text=True).stdout
    fprs = [line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:")]
    if not fprs:
        raise SigningError("no signing key in %s" % (key_dir / "gnupg"))
    return fprs[0]


def ensure_key(key_dir: Path, name: str = "pdctl artifact store") -> str:
    """Make the signing key once (Ed25519, no passphrase: it signs unattended); return its fingerprint."""
    with session(key_dir, name) as fpr:
        return fpr


def _ensure_key_locked(key_dir: Path, name: str) -> str:
    try:
        fpr = fingerprint(key_dir)
    except SigningError:
        try:
            _gpg(key_dir, "--pinentry-mode", "loopback", "--passphrase", "", "--quick-generate-key",
                 "%s <pdctl-store@invalid>" % name, "ed25519", "sign", "never")
        except SigningError as exc:
            # Seen once with six signers at once on a loaded 2-core machine: the listing above came back empty
            # while the key existed (the agent the previous session stopped not back yet), and gpg refused to
            # make it again. The key is there: read it again with a new agent.
            if "already exists" not in str(exc):
                raise
            _stop_agent(key_dir)
        fpr = fingerprint(key_dir)
    asc = _gpg(key_dir, "--armor", "--export", fpr).stdout
    binary = _gpg(key_dir, "--export", fpr).stdout
    for fname, data in ((PUBLIC_ASC, asc), (PUBLIC_GPG, binary)):
        path = key_dir / fname
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
    return fpr


def verify(repo_dir: Path, keyring: Path) -> bool:
    """True if InRelease and Release.gpg both verify with keyring and InRelease carries Release's text."""
    if not all((repo_dir / name).exists() for name in ("Release",) + SIGNATURES):
        return False
    clear = subprocess.run(["gpgv", "--keyring", str(keyring), "--output", "-", str(repo_dir / "InRelease")],
                           capture_output=True)
    detached = subprocess.run(["gpgv", "--keyring", str(keyring), str(repo_dir / "Release.gpg"),
                               str(repo_dir / "Release")], capture_output=True)
    return clear.returncode == 0 and detached.returncode == 0 and \
        clear.stdout.strip() == (repo_dir / "Release").read_bytes().strip()


def sign(key_dir: Path, repo_dir: Path) -> bool:
    """Sign repo_dir/Release unless its signatures already verify with this key; True if it signed."""
    release = repo_dir / "Release"
    with session(key_dir) as fpr:
        if verify(repo_dir, key_dir / PUBLIC_GPG):
            return False
        for name, args in (("InRelease", ["--clearsign"]), ("Release.gpg", ["--armor", "--detach-sign"])):
            tmp = repo_dir / (name + ".part")
            tmp.unlink(missing_ok=True)
            clearsign(key_dir, fpr, release, tmp, *args)
            tmp.replace(repo_dir / name)
    if not verify(repo_dir, key_dir / PUBLIC_GPG):
        raise SigningError("the signatures just made in %s do not verify" % repo_dir)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pdctl.apt_signing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    k = sub.add_parser("key", help="make the signing key (once) and export its public half")
    k.add_argument("key_dir", type=Path)
    s = sub.add_parser("sign", help="sign an apt repository's Release (InRelease, Release.gpg)")
    s.add_argument("key_dir", type=Path)
    s.add_argument("repo_dir", type=Path)
    args = p.parse_args(argv)
    try:
        if args.action == "key":
            print("%s (public key: %s)" % (ensure_key(args.key_dir), os.path.join(args.key_dir, PUBLIC_ASC)))
        else:
            print("signed" if sign(args.key_dir, args.repo_dir) else "signatures already valid")
    except SigningError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
