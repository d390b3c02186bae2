"""The model_weights role end to end, on three inventory hosts that run locally.

Each "host" is ansible_connection=local with its own served path in a tmp dir; the external
source is the synthetic model behind the Hub API stub (with a token). The lab test (three podman
hosts) runs the same role; this one needs no lab and checks the same properties:
every host ends verified, the Hub is read once, a second run changes nothing, check mode
writes nothing, and the token appears nowhere.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pdctl import collection
from pdctl.lab import synthetic_model as sm
from ansible_collections.pdctl.vllm_pd.plugins.module_utils import model as pdm

pytestmark = pytest.mark.slow
ROOT = collection.root()
TOKEN = "hf_ROLEtest987654321secret"
HOSTS = ("h-prefill-0", "h-prefill-1", "h-decode-0")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def playbook(tmp, hub_url, revision, port, extra=""):
    inv = {"all": {"hosts": {h: {"ansible_connection": "local",
                                 "ansible_python_interpreter": sys.executable,
                                 "ansible_host": "127.0.0.1",
                                 "pdctl_model_path": str(tmp / h / "mnt" / "GLM-5.2-NVFP4")} for h in HOSTS},
                   "vars": {"pdctl_versions": {"model_revision": revision},
                            "model_weights_source": "hf://" + sm.REPO_ID,
                            "model_weights_hub_endpoint": hub_url,
                            "model_weights_fanout_port": port,
                            "model_weights_fanout_idle_timeout": 30}}}
    (tmp / "hosts.json").write_text(json.dumps(inv))
    (tmp / "play.yml").write_text(
        "- name: Model weights\n  hosts: all\n  gather_facts: false\n  become: false\n"
        # as site.yml runs it: the fan-out server's async job needs Ansible's own linear strategy
        "  strategy: ansible.builtin.linear\n"
        "  roles:\n    - role: pdctl.vllm_pd.model_weights\n" + extra)


def ansible(tmp, *args):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), HF_TOKEN=TOKEN,
               ANSIBLE_LOCAL_TEMP=str(tmp / ".ansible-tmp"), ANSIBLE_REMOTE_TEMP=str(tmp / ".ansible-tmp"),
               ANSIBLE_ASYNC_DIR=str(tmp / ".ansible-async"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp / "hosts.json"),
                           str(tmp / "play.yml"), "-v", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def recap(out):
    return {m.group(1): {"changed": int(m.group(2)), "failed": int(m.group(3))}
            for m in re.finditer(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", out, re.M)}


def test_role_stages_once_fans_out_and_is_idempotent(tmp_path):
    info = sm.build(str(tmp_path / "hub"), size_mb=4, shards=3, seed=3)
    port = free_port()
    outputs = []
    with sm.HubStub(str(tmp_path / "hub"), token=TOKEN) as hub:
        playbook(tmp_path, hub.url, info["revision"], port)

        rc, out = ansible(tmp_path, "--check")
        outputs.append(out)
        assert rc == 0, out
        assert all(not (tmp_path / h / "mnt").exists() for h in HOSTS), "check mode wrote a served path"
        assert recap(out)[HOSTS[0]]["changed"] >= 1

        rc, out = ansible(tmp_path)
        outputs.append(out)
        assert rc == 0, out
        assert hub.bytes_served == info["size"], "the external source must be read once"

        rc, out = ansible(tmp_path)
        outputs.append(out)
        assert rc == 0, out
        assert all(r["changed"] == 0 and r["failed"] == 0 for r in recap(out).values()), out
        assert hub.bytes_served == info["size"]
        assert all(r["authorization"] == "Bearer " + TOKEN for r in hub.requests)
    external = 0
    for h in HOSTS:
        path = str(tmp_path / h / "mnt" / "GLM-5.2-NVFP4")
        st = pdm.status(path, info["revision"], full=True)
        assert st["verified"] and st["manifest_digest"] == info["manifest_digest"], (h, st)
        for line in open(pdm.Layout(path).transfer_log):
            rec = json.loads(line)
            if rec["source"].startswith("hf://"):
                external += rec["bytes_from_source"]
            else:
                assert rec["source"] == "http://127.0.0.1:%d/" % port
    assert external == info["size"]

    for text in outputs:
        assert TOKEN not in text
    for dirpath, _, files in os.walk(tmp_path):
        if "/hub" in dirpath:
            continue
        for f in files:
            assert TOKEN.encode() not in Path(dirpath, f).read_bytes(), os.path.join(dirpath, f)
