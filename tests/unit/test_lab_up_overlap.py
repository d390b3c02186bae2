"""`pdctl-lab up` on a cold cache stages the wheelhouse beside the image build (both mostly wait on
the network), records both steps' seconds, and still fails when the wheelhouse fails."""
import json
import threading

import pytest

from pdctl.lab import hosts, image, stage, store


@pytest.fixture
def bring_up(tmp_path, monkeypatch):
    """hosts.up() with everything that touches podman, ssh or the network replaced; `wheels` is the
    wheelhouse step (replace it per test)."""
    monkeypatch.setattr(hosts, "lab_dir", lambda: tmp_path)
    monkeypatch.setattr(hosts, "lab_hosts", lambda inv=None: [hosts.LabHost("lab-x", "10.89.64.60")])
    monkeypatch.setattr(hosts, "container_options", lambda: [])
    monkeypatch.setattr(hosts.shutil, "which", lambda tool: "/usr/bin/" + tool)
    monkeypatch.setattr(hosts, "_ssh_key", lambda: tmp_path / "id")
    monkeypatch.setattr(hosts, "_ensure_network", lambda: None)
    monkeypatch.setattr(hosts, "_container_state", lambda name: None)
    monkeypatch.setattr(hosts, "_forget_host_key", lambda host: None)
    monkeypatch.setattr(hosts, "_wait_ssh", lambda *a, **k: None)
    monkeypatch.setattr(hosts, "run", lambda cmd, **kw: None)
    monkeypatch.setattr(store, "ensure_started", lambda d: None)
    staged = []
    monkeypatch.setattr(stage, "stage_all", lambda *a: staged.append(a) or {"model": 0.0})
    return tmp_path, staged


def test_the_wheelhouse_is_staged_while_the_image_builds(bring_up, monkeypatch):
    lab_dir, staged = bring_up
    wheels_started = threading.Event()
    seen_during_image = []

    def build_image(opts):
        # The image build waits (as on the mirror) until the wheelhouse has started: only concurrent steps
        # get past this; a sequential bring-up would wait the whole timeout and record False.
        seen_during_image.append(wheels_started.wait(timeout=60))
        return "localhost/pdctl-lab:t"

    wheel_runs = []
    monkeypatch.setattr(stage, "ensure_wheels", lambda lab, inv: wheel_runs.append(lab) or wheels_started.set())
    monkeypatch.setattr(image, "ensure", build_image)

    assert hosts.up() == 0
    assert seen_during_image == [True], "the wheelhouse did not start before the image build ended"
    assert len(staged) == 1 and len(wheel_runs) == 1, "the wheelhouse was staged %d times" % len(wheel_runs)
    timings = json.loads((lab_dir / "up-timings.json").read_text())
    assert {"image", "hosts", "wheelhouse", "wheelhouse_wait", "model"} <= set(timings), timings


def test_a_failing_wheelhouse_fails_the_bring_up(bring_up, monkeypatch):
    def broken(lab, inv):
        raise RuntimeError("pip download failed: no matching distribution for vllm-router==9.9")

    monkeypatch.setattr(stage, "ensure_wheels", broken)
    monkeypatch.setattr(image, "ensure", lambda opts: "localhost/pdctl-lab:t")
    with pytest.raises(RuntimeError, match="vllm-router==9.9"):
        hosts.up()
