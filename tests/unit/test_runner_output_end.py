"""pdctl.runner.run_playbook when the reader of the playbook's output falls behind (a starved controller):
ansible-runner reads that output through a terminal, and by itself gives up 5 s after its read loop's own
5 s (ansible/ansible-runner#1343). A stand-in `ansible-playbook` on PATH writes its lines at once and exits a
second later (its output is in the terminal by then, unread); a slow progress callback makes the reader slow."""
import os
import sys
import time

import pytest

from pdctl import collection, runner

LINE = "x" * 199  # with its newline, ten lines fill one of pexpect's 2000-byte reads


@pytest.fixture
def playbook(tmp_path, monkeypatch):
    def make(lines):
        bindir = tmp_path / "bin"
        bindir.mkdir()
        script = bindir / "ansible-playbook"
        (tmp_path / "output").write_text((LINE + "\n") * lines)
        script.write_text("#!/bin/sh\ncat %s\nsleep 1\nexit 0\n" % (tmp_path / "output"))
        script.chmod(0o755)
        # The stand-in first; this interpreter's bin dir on PATH too, so run_playbook leaves PATH alone.
        monkeypatch.setenv("PATH", os.pathsep.join([str(bindir), os.path.dirname(sys.executable),
                                                    os.environ["PATH"]]))
        return str(tmp_path / "site.yml")
    return make


def slow_reader(seconds_per_line):
    seen = []

    def progress(kind, data):
        if LINE in (data.get("stdout") or "") or kind == "verbose":
            seen.append(kind)
            time.sleep(seconds_per_line)
    return progress, seen


def test_output_read_for_longer_than_ansible_runners_own_ten_seconds_is_read_to_the_end(playbook, tmp_path):
    book = playbook(lines=20)
    progress, seen = slow_reader(0.6)  # two reads of 6 s each
    result = runner.run_playbook(book, tmp_path, private_data_dir=str(tmp_path / "run"), progress=progress)
    assert result.rc == 0 and result.status == "successful"
    assert len(seen) == 20
    assert (result.artifact_dir / "stdout").read_text().count(LINE) == 20


def test_output_not_read_to_the_end_in_time_is_a_clear_error(playbook, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "OUTPUT_END_WAIT_S", 1)
    book = playbook(lines=20)
    progress, _ = slow_reader(0.6)
    pdd = tmp_path / "run"
    with pytest.raises(runner.RunnerError, match=r"site\.yml: ansible-playbook exited, but ansible-runner gave "
                                                 r"up reading its output before the end .* its result is unknown") as err:
        runner.run_playbook(book, tmp_path, private_data_dir=str(pdd), progress=progress)
    assert str(pdd) in str(err.value)


def test_the_command_line_prints_it_without_a_traceback(monkeypatch, capsys, tmp_path):
    from pdctl import cli, render

    def unknown(*args, **kwargs):
        raise runner.RunnerError("playbooks/render.yml: its result is unknown")
    monkeypatch.setattr(runner, "run_playbook", unknown)
    assert render.runner is runner
    inventory = collection.root() / "inventories" / "lab"
    assert cli.main(["render", "-i", str(inventory), "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == "pdctl render: playbooks/render.yml: its result is unknown\n"
