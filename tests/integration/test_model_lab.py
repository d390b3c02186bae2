"""Model weights on the lab: every host serves the verified model; the Hub was read once, not three times."""
import json
import subprocess

import pytest

from inventories import ROOT

pytestmark = [pytest.mark.lab, pytest.mark.slow]
HOSTS = ("lab-prefill-0", "lab-prefill-1", "lab-decode-0")
SERVED = "/mnt/model/glm/GLM-5.2-NVFP4"
VERSIONS = "/mnt/model/glm/.GLM-5.2-NVFP4.versions"


def on_host(host, *argv):
    return subprocess.run(["podman", "exec", host, *argv], capture_output=True, text=True, check=True).stdout


def test_every_host_serves_the_verified_model_read_once_from_the_hub(converged_lab):
    manifest = json.loads((ROOT / ".lab/model/.pdctl-manifest.json").read_text())
    revision = manifest["revision"]
    size = sum(f["size"] for f in manifest["files"])
    from_hub = []
    for host in HOSTS:
        assert on_host(host, "readlink", SERVED).strip().endswith(".GLM-5.2-NVFP4.versions/" + revision)
        assert on_host(host, "test", "-f", "%s/%s.verified.json" % (VERSIONS, revision)) == ""
        lines = [json.loads(l) for l in on_host(host, "cat", VERSIONS + "/transfers.jsonl").splitlines() if l]
        mine = [l for l in lines if l["revision"] == revision]
        assert mine, "%s never filled revision %s" % (host, revision)
        from_hub += [l for l in mine if l["source"].startswith("hf://")]
    assert len(from_hub) == 1, "the Hub was read by %d fills" % len(from_hub)
    assert from_hub[0]["bytes_from_source"] == size
    print("bytes read from the Hub for 3 hosts: %d (model size %d)" % (from_hub[0]["bytes_from_source"], size))
