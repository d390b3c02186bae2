"""Run playbooks through ansible-runner (as CI does) and summarise the per-host outcome."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pdctl import collection


GATE_ACTIONS = {"pdctl.vllm_pd.sla_gate": "sla", "pdctl.vllm_pd.accuracy_gate": "accuracy"}
# host_stack.yml's report of the prefill hosts it quarantined (pdctl_min_prefill_instances).
QUARANTINE_REPORT_TASK = "Report the quarantined hosts"
# How long ansible-runner's read loop waits for the playbook's output to end before it looks again. With its
# default (5 s), a playbook that exits while its last output is still unread reaches ansible-runner's final
# read, which gives up after a fixed 5 s and raises pexpect's TIMEOUT (ansible/ansible-runner#1343): on a
# busy controller (CI, a low-priority job) a successful run became a traceback. With a long wait the loop
# itself reads to the end of the output; nothing else waits on it (no prompts, no cancel callback). Output
# the terminal delivers only after the loop saw the playbook's end still gets ansible-runner's last 5 s.
OUTPUT_END_WAIT_S = 300


class RunnerError(RuntimeError):
    """ansible-runner could not report the run: the playbook's result is unknown."""


@dataclass
class PlaybookResult:
    rc: int
    status: str
    stats: dict
    artifact_dir: Path
    failures: list = field(default_factory=list)
    # [{"play", "host", "ok", "changed", "failed", "unreachable", "skipped", "failure": {task, msg} | None}]
    outcomes: list = field(default_factory=list)
    # {"sla" | "accuracy": the gate module's result (passed, failures, runs/benchmarks, files)}
    gates: dict = field(default_factory=dict)
    # The quarantine report's lines (a headline, then "<host>: <check>: <message>"); [] when none.
    quarantine: list = field(default_factory=list)
    # What the playbooks reported through set_stats ({name: data, with "play": the play that reported it}), as the
    # run's stats (the playbook_on_stats event's artifact_data) have it, e.g. playbooks/gates.yml's
    # pdctl_gates_verdict and playbooks/upgrade.yml's pdctl_upgrade: outcomes are read from there, not from task names.
    # A list (pdctl_rollout_plan's lines) is kept as it is, without the play.
    reported: dict = field(default_factory=dict)

    def total(self, key: str) -> int:
        return sum((self.stats.get(key) or {}).values())

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def task_results(self, task: str) -> dict:
        """{host: that host's final result of the task named `task` (ok or failed)}, from the run's events
        (a loop task's per-item results are under "results")."""
        out = {}
        for path in sorted((self.artifact_dir / "job_events").glob("*.json")):
            event = json.loads(path.read_text())
            data = event.get("event_data") or {}
            if event.get("event") in ("runner_on_ok", "runner_on_failed") and data.get("task") == task:
                out[data["host"]] = data.get("res") or {}
        return out

    def recap(self) -> str:
        hosts = sorted(set().union(*[set(v or {}) for v in self.stats.values()])) if self.stats else []
        lines = []
        for h in hosts:
            lines.append("%-16s " % h + " ".join("%s=%d" % (k, (self.stats.get(k) or {}).get(h, 0))
                                                  for k in ("ok", "changed", "failures", "dark", "skipped")))
        return "\n".join(lines)


def _with_play(value, play):
    """A report with the play that made it (a dict's "play" key); a list (lines, e.g. pdctl_rollout_plan) as it is."""
    return dict(value, play=play) if isinstance(value, dict) else list(value)


class _Recorder:
    """ansible-runner event handler: failures, per play and host outcomes, gate results, progress."""

    def __init__(self, progress=None):
        self.failures = []
        self.outcomes = {}  # (play, host) -> counts
        self.gates = {}
        self.quarantine = []
        self.reported = {}
        self.reported_in = {}  # {name: the play whose set_stats task reported it}
        self.play = None
        self.progress = progress

    def _outcome(self, host):
        key = (self.play, host)
        if key not in self.outcomes:
            self.outcomes[key] = {"play": self.play, "host": host, "ok": 0, "changed": 0, "failed": 0,
                                  "unreachable": 0, "skipped": 0, "failure": None}
        return self.outcomes[key]

    def __call__(self, event):
        kind = event.get("event")
        data = event.get("event_data") or {}
        if kind == "playbook_on_play_start":
            self.play = data.get("play") or data.get("name")
        elif kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped"):
            res = data.get("res") or {}
            out = self._outcome(data.get("host"))
            if kind == "runner_on_failed" and data.get("ignore_errors"):
                kind = "runner_on_ok"
            if kind == "runner_on_ok":
                out["ok"] += 1
                out["changed"] += 1 if res.get("changed") else 0
            elif kind == "runner_on_skipped":
                out["skipped"] += 1
            else:
                out["unreachable" if kind == "runner_on_unreachable" else "failed"] += 1
                failure = {"host": data.get("host"), "play": self.play, "task": data.get("task"),
                           "action": data.get("resolved_action") or data.get("task_action"),
                           "msg": res.get("msg"), "unreachable": kind == "runner_on_unreachable"}
                out["failure"] = out["failure"] or failure
                self.failures.append(failure)
            if kind == "runner_on_ok" and data.get("task") == QUARANTINE_REPORT_TASK:
                msg = res.get("msg")
                self.quarantine = [str(m) for m in msg] if isinstance(msg, list) else [str(msg)]
            if kind == "runner_on_ok" and isinstance(res.get("ansible_stats"), dict):
                for name, value in (res["ansible_stats"].get("data") or {}).items():
                    if name.startswith("pdctl_") and isinstance(value, (dict, list)):
                        self.reported[name] = _with_play(value, self.play)
                        self.reported_in[name] = self.play
            gate = GATE_ACTIONS.get(data.get("resolved_action") or data.get("task_action"))
            if gate and kind in ("runner_on_ok", "runner_on_failed"):
                self.gates[gate] = {k: v for k, v in res.items() if not k.startswith("_") and k != "invocation"}
        elif kind == "playbook_on_stats":
            # The run's own account of what set_stats reported (per_host: false): what the playbook ended with is
            # read from here first; the play that reported it comes from the set_stats task's event.
            for name, value in (data.get("artifact_data") or {}).items():
                if name.startswith("pdctl_") and isinstance(value, (dict, list)):
                    self.reported[name] = _with_play(value, self.reported_in.get(name))
        if self.progress:
            self.progress(kind, data)
        return True  # keep every event in the artifacts


def run_playbook(playbook: str, inventory: str | os.PathLike, *, check: bool = False, diff: bool = False,
                 extravars: dict | None = None, tags: str | None = None, limit: str | None = None,
                 quiet: bool = True, extra_args: list[str] | None = None, progress=None,
                 envvars: dict | None = None, private_data_dir: str | None = None) -> PlaybookResult:
    """Run a playbook of the collection (a path relative to it) or any playbook (an absolute path)."""
    import shlex
    import sys

    import ansible_runner
    import pexpect

    # ansible-runner starts `ansible-playbook` from PATH: make it this environment's.
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    root = collection.root()
    pdd = private_data_dir or tempfile.mkdtemp(prefix="pdctl-runner-")
    recorder = _Recorder(progress)

    cmdline = []
    if check:
        cmdline.append("--check")
    if diff:
        cmdline.append("--diff")
    cmdline += list(extra_args or [])
    env = {"ANSIBLE_CONFIG": str(root / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "0"}
    env.update(envvars or {})
    book = Path(playbook) if Path(playbook).is_absolute() else root / playbook
    # Through the private data dir's env/settings: ansible-runner 2.4 drops a `settings` argument when that
    # file is absent.
    env_dir = Path(pdd) / "env"
    env_dir.mkdir(parents=True, exist_ok=True)
    (env_dir / "settings").write_text(json.dumps({"pexpect_timeout": OUTPUT_END_WAIT_S}) + "\n")
    try:
        r = ansible_runner.run(
            private_data_dir=pdd,
            project_dir=str(book.parent if Path(playbook).is_absolute() else root),
            playbook=str(book),
            inventory=str(Path(inventory).resolve()),
            extravars=extravars or {},
            tags=tags,
            limit=limit,
            cmdline=" ".join(shlex.quote(c) for c in cmdline) or None,
            envvars=env,
            quiet=quiet,
            suppress_env_files=True,
            event_handler=recorder,
        )
    except pexpect.exceptions.TIMEOUT:
        raise RunnerError("%s: ansible-playbook exited, but ansible-runner gave up reading its output before the "
                          "end (is the controller starved of CPU? ansible/ansible-runner#1343), so its result is "
                          "unknown; the events read so far are under %s" % (playbook, pdd)) from None
    return PlaybookResult(rc=r.rc, status=r.status, stats=r.stats or {}, artifact_dir=Path(r.config.artifact_dir),
                          failures=recorder.failures, outcomes=list(recorder.outcomes.values()),
                          gates=recorder.gates, quarantine=recorder.quarantine, reported=recorder.reported)
