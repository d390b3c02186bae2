"""roles/monitoring/files/pdctl-unit-memory, run as the hosts run it (python3 SCRIPT --out FILE), on a /proc
laid out as on the lab's cgroup v1 hybrid hosts and on production's cgroup v2 Ubuntu hosts: each instance unit's
processes (API server and engine cores) summed, other units and kernel threads left out; each unit's start time
(its oldest process's); and once against this machine's real /proc."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import promql
from alert_coverage import UNIT_MEMORY_SCRIPT

LIBPOD = "/libpod_parent/libpod-9869ed81"
V1_HYBRID = ("9:name=systemd:%s/system.slice/{unit}\n4:memory:%s\n1:cpu:%s\n0::%s/system.slice/{unit}\n"
             % (LIBPOD, LIBPOD, LIBPOD, LIBPOD))
V2 = "0::/system.slice/{unit}\n"


BTIME = 1_800_000_000
TICKS = os.sysconf("SC_CLK_TCK")


def _proc(root, pid, cgroup, anon_kb=None, started_s=100):
    """A process of /proc: started started_s seconds after boot (BTIME)."""
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text(cgroup)
    (d / "status").write_text("Name:\tpython3\nVmRSS:\t 99999 kB\n" +
                              ("RssAnon:\t%8d kB\n" % anon_kb if anon_kb is not None else ""))
    # A command name with a space and a parenthesis, as "(sd-pam)" or "VLLM::EngineCore" can be.
    (d / "stat").write_text("%d (vllm (DP 0) x) S 1 %d %d 0 -1 4194560 %s %d 0 0\n"
                            % (pid, pid, pid, " ".join(["0"] * 12), started_s * TICKS))
    (root / "stat").write_text("cpu  1 2 3\nbtime %d\nprocesses 9\n" % BTIME)


def _run(tmp_path, proc):
    out = tmp_path / "textfile" / "pdctl-units.prom"
    out.parent.mkdir(exist_ok=True)
    subprocess.run([sys.executable, str(UNIT_MEMORY_SCRIPT), "--out", str(out), "--proc", str(proc)], check=True)
    return out


def _samples(text):
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def test_sums_each_instance_units_processes_on_cgroup_v1_hybrid_and_v2(tmp_path):
    for layout, cgroup in (("v1", V1_HYBRID), ("v2", V2)):
        proc = tmp_path / layout / "proc"
        unit = "pdctl-vllm-decode-0.service"
        _proc(proc, 100, cgroup.format(unit=unit), 200_000, started_s=50)    # API server
        for pid in (101, 102):                                                # engine cores, started after it
            _proc(proc, pid, cgroup.format(unit=unit), 1_000_000, started_s=53)
        _proc(proc, 200, cgroup.format(unit="pdctl-vllm-prefill-0.service"), 300)
        _proc(proc, 300, cgroup.format(unit="pdctl-router.service"), 5_000)   # not an instance
        _proc(proc, 400, cgroup.format(unit="pdctl-vllm-prefill-0.service"))  # a kernel thread: no RssAnon
        (proc / "self").mkdir()
        text = _run(tmp_path / layout, proc).read_text()
        assert _samples(text) == {
            'pdctl_unit_memory_anon_bytes{instance_name="decode-0",unit="pdctl-vllm-decode-0.service"}':
                2_200_000 * 1024,
            'pdctl_unit_memory_anon_bytes{instance_name="prefill-0",unit="pdctl-vllm-prefill-0.service"}': 300 * 1024,
            'pdctl_unit_processes{instance_name="decode-0",unit="pdctl-vllm-decode-0.service"}': 3,
            'pdctl_unit_processes{instance_name="prefill-0",unit="pdctl-vllm-prefill-0.service"}': 2,
            'pdctl_unit_start_time_seconds{instance_name="decode-0",unit="pdctl-vllm-decode-0.service"}': BTIME + 50,
            'pdctl_unit_start_time_seconds{instance_name="prefill-0",unit="pdctl-vllm-prefill-0.service"}': BTIME + 100,
        }, layout
        assert "# TYPE pdctl_unit_memory_anon_bytes gauge" in text
        assert promql.exposition_names(text) == {"pdctl_unit_memory_anon_bytes", "pdctl_unit_processes",
                                                 "pdctl_unit_start_time_seconds"}


def test_a_start_time_read_from_the_real_proc_is_when_the_process_started():
    """This machine's /proc (the kernel's own stat format): a process started now reads as started now."""
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("pdctl_unit_memory", str(UNIT_MEMORY_SCRIPT))
    script = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(script)
    before = time.time()
    child = subprocess.Popen(["sleep", "30"])
    try:
        with open("/proc/%d/stat" % child.pid) as fh:
            started = script.boot_time("/proc") + script.started_after_boot(fh.read(), TICKS)
    finally:
        child.kill()
    # btime is whole seconds and the start is in clock ticks: a second either way.
    assert before - 1.5 <= started <= time.time() + 1.5, (started, before)


def test_no_instance_unit_writes_an_empty_file_and_replaces_it_whole(tmp_path):
    proc = tmp_path / "proc"
    _proc(proc, 1, V2.format(unit="init.scope"), 10)
    out = _run(tmp_path, proc)
    assert _samples(out.read_text()) == {}
    assert sorted(p.name for p in out.parent.iterdir()) == ["pdctl-units.prom"]  # no temporary file left
    assert oct(out.stat().st_mode & 0o777) == "0o644"  # node exporter runs as its own user
