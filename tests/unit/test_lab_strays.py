"""pdctl.lab.strays: a process that left its parent's session is still found below it, and ended after the
group's kill (how a killed playbook's Mitogen multiplexers outlive it)."""
import os
import signal
import subprocess
import time

from pdctl.lab import strays


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (ended, not yet reaped by its parent) counts as ended.
    return open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_child_in_its_own_session_outlives_the_group_kill_and_is_ended_after():
    # The group leader starts a child in a new session (as Mitogen's multiplexer does), prints its pid, waits.
    proc = subprocess.Popen(["bash", "-c", "setsid sleep 300 & echo $!; sleep 300"], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    stray = int(proc.stdout.readline())
    deadline = time.monotonic() + 10
    while stray not in strays.descendants(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # setsid may fork once more before exec'ing sleep
    below = strays.descendants(proc.pid)
    assert stray in below
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _alive(stray), "the stray should have survived the group's kill (else this test shows nothing)"
    assert stray in strays.end(below)
    deadline = time.monotonic() + 10
    while _alive(stray) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(stray)


def test_ending_processes_that_are_gone_is_quiet():
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert strays.end([proc.pid]) == []
