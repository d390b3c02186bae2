"""The lab's background servers on the controller (artifact store, Hub stub).

They listen on the lab network's gateway at fixed ports, so there is one of each per machine, whichever
checkout started it. Each is recorded machine-wide (pid and the checkout's lab directory) in
`registry_dir()`: a second checkout takes a server over cleanly, as it already does the hosts
(its hosts trust its own key, its store serves its own files, its Hub stub its own token), instead of
silently talking to the first checkout's servers.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def registry_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    d = Path(base) / ("pdctl-lab-%d" % os.getuid())
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not serving anything.
    try:
        return Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _start_time(pid: int) -> str | None:
    """When the process started (field 22 of /proc/<pid>/stat, clock ticks since boot)."""
    try:
        return Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner(name: str) -> dict | None:
    """{'pid', 'lab_dir', 'start_time'} of the running server called name, whichever checkout started it.

    None once that process is gone. Pids wrap around (32768 on a default kernel, soon reached by a test
    run), so a recorded pid alone may name an unrelated process by now: it would be stopped as a "server"
    to take over. The start time recorded with it tells them apart; an entry without one (written before
    it was recorded) is not trusted.
    """
    try:
        entry = json.loads((registry_dir() / ("%s.json" % name)).read_text())
        pid = int(entry["pid"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
    if not _alive(pid) or entry.get("start_time") != _start_time(pid):
        return None
    return entry


def running_pid(lab_dir: Path, name: str) -> int | None:
    """The server's pid if it runs for this checkout's lab."""
    entry = owner(name)
    return int(entry["pid"]) if entry and entry.get("lab_dir") == str(lab_dir) else None


def _terminate(pid: int, timeout: float = 5.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.1)


def start(lab_dir: Path, name: str, argv: list[str], probe_url: str, ok_codes=(200,), timeout=20.0) -> bool:
    """Start `argv` detached unless it already runs for this lab; wait until probe_url answers.

    True if started now. A server of the same name started by another checkout is stopped first.
    """
    entry = owner(name)
    if entry and entry.get("lab_dir") == str(lab_dir):
        return False
    if entry:
        print("lab: taking the %s over from the checkout at %s (pid %d)"
              % (name, Path(entry["lab_dir"]).parent, entry["pid"]), flush=True)
        _terminate(int(entry["pid"]))
    log_path = lab_dir / ("%s.log" % name)
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    (registry_dir() / ("%s.json" % name)).write_text(json.dumps(
        {"pid": proc.pid, "lab_dir": str(lab_dir), "start_time": _start_time(proc.pid)}))
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            # Exited: most often the port is held by a process this registry does not know.
            raise RuntimeError("%s exited (code %s) before serving; see %s (is another program listening on %s?)"
                               % (name, proc.returncode, log_path, probe_url))
        try:
            urllib.request.urlopen(probe_url, timeout=2).close()
            break
        except urllib.error.HTTPError as exc:
            if exc.code in ok_codes:
                break
            err = exc
        except OSError as exc:
            err = exc
        if time.monotonic() > deadline:
            raise RuntimeError("%s did not answer %s within %ds (%s); see %s" % (name, probe_url, timeout, err, log_path))
        time.sleep(0.2)
    # The answer may have come from a stranger on the port while ours was still failing to bind.
    time.sleep(0.2)
    if proc.poll() is not None:
        raise RuntimeError("%s exited (code %s) right after start; see %s (is another program listening on %s?)"
                           % (name, proc.returncode, log_path, probe_url))
    return True


def stop(lab_dir: Path, name: str) -> None:
    """Stop the server if it runs for this checkout (another checkout's is left alone)."""
    pid = running_pid(lab_dir, name)
    if pid:
        _terminate(pid)
        (registry_dir() / ("%s.json" % name)).unlink(missing_ok=True)
