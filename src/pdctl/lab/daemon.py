"""The lab's background servers on the controller (artifact store, Hub stub): a pid file each in .lab/."""
from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


def running_pid(lab_dir: Path, name: str) -> int | None:
    try:
        pid = int((lab_dir / ("%s.pid" % name)).read_text())
        os.kill(pid, 0)
        return pid
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None


def start(lab_dir: Path, name: str, argv: list[str], probe_url: str, ok_codes=(200,), timeout=20.0) -> bool:
    """Start `argv` detached unless it already runs; wait until probe_url answers. True if started now."""
    if running_pid(lab_dir, name):
        return False
    log = open(lab_dir / ("%s.log" % name), "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    (lab_dir / ("%s.pid" % name)).write_text(str(proc.pid))
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(probe_url, timeout=2).close()
            return True
        except urllib.error.HTTPError as exc:
            if exc.code in ok_codes:
                return True
            err = exc
        except OSError as exc:
            err = exc
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("%s did not start (%s); see %s (another checkout's lab may hold the port: "
                               "run `pdctl lab down` there)" % (name, err, lab_dir / ("%s.log" % name)))
        time.sleep(0.2)


def stop(lab_dir: Path, name: str) -> None:
    pid = running_pid(lab_dir, name)
    if pid:
        os.kill(pid, signal.SIGTERM)
    (lab_dir / ("%s.pid" % name)).unlink(missing_ok=True)
