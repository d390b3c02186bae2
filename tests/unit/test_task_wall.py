"""benchmarks/task_wall.py sums each task's wall time over ansible-runner runs (start to next start)."""
import json
import subprocess
import sys

from inventories import ROOT

SCRIPT = ROOT / "benchmarks" / "task_wall.py"


def write_run(run_dir, starts):
    """An ansible-runner private data dir whose job_events hold these (seconds, task) task starts."""
    events = run_dir / "artifacts" / "0f7a" / "job_events"
    events.mkdir(parents=True)
    for i, (second, task) in enumerate(starts):
        (events / ("%d-x.json" % i)).write_text(json.dumps({
            "event": "playbook_on_task_start", "created": "2026-12-02T12:00:%02d.000000+00:00" % second,
            "event_data": {"task": task}}))
    (events / "99-x.json").write_text(json.dumps({"event": "runner_on_ok", "created": "2026-12-02T12:00:59+00:00"}))


def test_each_task_gets_the_time_to_the_next_start_summed_over_runs(tmp_path):
    write_run(tmp_path / "a", [(0, "Gather facts"), (5, "Router is ready"), (12, "Report")])
    write_run(tmp_path / "b", [(0, "Gather facts"), (3, "Report")])
    res = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "a"), str(tmp_path / "b")],
                         capture_output=True, text=True, check=True)
    lines = res.stdout.splitlines()
    assert lines[0].startswith("2 runs, 15 s of task wall time")
    assert lines[1].split() == ["8.0", "s", "2", "Gather", "facts"]
    assert lines[2].split() == ["7.0", "s", "1", "Router", "is", "ready"]
    assert len(lines) == 3  # the last task of a run has no end


def test_no_runs_is_an_error_naming_where_it_looked(tmp_path):
    res = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "none")], capture_output=True, text=True)
    assert res.returncode == 2 and "no ansible-runner events under %s" % (tmp_path / "none") in res.stderr
