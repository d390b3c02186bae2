"""Run playbooks through ansible-runner (as CI does) and summarise the per-host outcome."""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pdctl import collection


@dataclass
class PlaybookResult:
    rc: int
    status: str
    stats: dict
    artifact_dir: Path
    failures: list = field(default_factory=list)

    def total(self, key: str) -> int:
        return sum((self.stats.get(key) or {}).values())

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def recap(self) -> str:
        hosts = sorted(set().union(*[set(v or {}) for v in self.stats.values()])) if self.stats else []
        lines = []
        for h in hosts:
            lines.append("%-16s " % h + " ".join("%s=%d" % (k, (self.stats.get(k) or {}).get(h, 0))
                                                  for k in ("ok", "changed", "failures", "dark", "skipped")))
        return "\n".join(lines)


def run_playbook(playbook: str, inventory: str | os.PathLike, *, check: bool = False, diff: bool = False,
                 extravars: dict | None = None, tags: str | None = None, limit: str | None = None,
                 quiet: bool = True,
                 envvars: dict | None = None, private_data_dir: str | None = None) -> PlaybookResult:
    import sys

    import ansible_runner

    # ansible-runner starts `ansible-playbook` from PATH: make it this environment's.
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    root = collection.root()
    pdd = private_data_dir or tempfile.mkdtemp(prefix="pdctl-runner-")
    failures = []

    def on_event(event):
        data = event.get("event_data") or {}
        if event.get("event") in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            res = data.get("res") or {}
            failures.append({"host": data.get("host"), "task": data.get("task"), "msg": res.get("msg")})
        return True  # keep every event in the artifacts

    cmdline = []
    if check:
        cmdline.append("--check")
    if diff:
        cmdline.append("--diff")
    env = {"ANSIBLE_CONFIG": str(root / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "0"}
    env.update(envvars or {})
    r = ansible_runner.run(
        private_data_dir=pdd,
        project_dir=str(root),
        playbook=str(root / playbook),
        inventory=str(Path(inventory).resolve()),
        extravars=extravars or {},
        tags=tags,
        limit=limit,
        cmdline=" ".join(cmdline) or None,
        envvars=env,
        quiet=quiet,
        suppress_env_files=True,
        event_handler=on_event,
    )
    return PlaybookResult(rc=r.rc, status=r.status, stats=r.stats or {}, artifact_dir=Path(r.config.artifact_dir),
                          failures=failures)
