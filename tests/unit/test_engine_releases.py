"""The stand-in's releases (issue 15): four wheels of one source, each with its identity baked in;
A and B refuse each other's KV handshake as vLLM does; bad-sla is too slow for a 20 ms TPOT gate;
bad-accuracy answers wrongly; a refused cross-release pull is counted and logged on the decode side."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from inventories import ROOT
from test_supply_chain import fake_download
from pdctl import wheelhouse
from pdctl.lab import releases, stage
from pdctl.lab.engine import answers, args as engine_args, kv, profile as engine_profile
from pdctl.lab.engine.cli import load_model_dir
from pdctl.lab.engine.server import Engine, RequestFailed, handle_version
from pdctl.lab import tokenizer as lab_tokenizer

LAB_VARS = ROOT / "inventories/lab/group_vars/all"
# The lab serves prefill with 1 speculative token and decode with 3 (serving.yml): judge both.
SPEC_TOKENS = (1, 3)


def _lab_releases() -> dict:
    return yaml.safe_load((LAB_VARS / "host_requirements.yml").read_text())["pdctl_lab_engine_releases"]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    dest = tmp_path_factory.mktemp("wheels")
    return {name: stage._build_engine_wheel(dest, identity)
            for name, identity in releases.identities(_lab_releases()).items()}


@pytest.fixture(scope="module")
def installed(wheels) -> dict[str, dict]:
    """What each wheel says about itself when it is the `pdctl` a fresh interpreter imports."""
    code = ("import json, pdctl.lab.engine as e; from pdctl.lab.engine import kv, profile; "
            "print(json.dumps({'file': e.__file__, 'release': e.RELEASE, 'vllm': e.VLLM_VERSION, "
            "'compat': kv.compat_hash(e.VLLM_VERSION, '/mnt/model/glm', 'mtp'), "
            "'profile': profile.load('')}))")
    out = {}
    for name, wheel in wheels.items():
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env=dict(os.environ, PYTHONPATH=str(wheel)))
        out[name] = json.loads(res.stdout)
        assert out[name]["file"].startswith(str(wheel)), out[name]["file"]  # the wheel's code, not the checkout's
    return out


@pytest.fixture(scope="module")
def lab_profile(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("profile") / "profile.yml"
    path.write_text(stage.ENGINE_PROFILE)  # what `pdctl-lab up` installs on the hosts
    return str(path)


def test_the_four_release_wheels_build_each_with_its_identity(wheels, installed):
    versions = _lab_releases()
    assert sorted(versions) == ["A", "B", "bad-accuracy", "bad-sla"]
    pins = yaml.safe_load((ROOT / "inventories/b300/group_vars/all/versions.yml").read_text())["pdctl_versions"]
    for name, wheel in wheels.items():
        assert wheel.name == "pdctl_lab_engine-%s-py3-none-any.whl" % versions[name]
        with zipfile.ZipFile(wheel) as zf:
            assert "pdctl/lab/engine/_release.py" in zf.namelist()
            meta = zf.read("pdctl_lab_engine-%s.dist-info/METADATA" % versions[name]).decode()
        assert "Version: %s\n" % versions[name] in meta
        rel = installed[name]["release"]
        assert (rel["name"], rel["version"]) == (name, versions[name])
        assert installed[name]["vllm"] == rel["vllm_version"]
    assert installed["A"]["vllm"] == pins["vllm"]  # A is today's stand-in: the manifest's vLLM
    assert {installed[n]["vllm"] for n in ("B", "bad-sla", "bad-accuracy")} == {releases.TRAITS["B"]["vllm_version"]}
    assert installed["B"]["vllm"] != installed["A"]["vllm"]
    # The same identity builds the same bytes (a second `pdctl-lab up` reuses the cache).
    again = stage._build_engine_wheel(wheels["B"].parent / "again", releases.identities(versions)["B"])
    assert again.read_bytes() == wheels["B"].read_bytes()


def test_a_checkout_runs_as_release_a_without_traits():
    from pdctl.lab import engine

    assert engine.VLLM_VERSION == releases.TRAITS["A"]["vllm_version"] == releases.SOURCE["vllm_version"]
    assert engine.RELEASE["profile"] == {} and engine_profile.load("") == engine_profile.DEFAULTS


def _pull_request(decode, port, pieces):
    """A decode-side request that pulls lease r1 of engine p_dp0 through the side channel on port."""
    return {"id": "chatcmpl-r1", "arrival": asyncio.get_running_loop().time(), "prompt_tokens": 4,
            "pieces": [("x", False)] * pieces, "finish": "stop", "rank": decode.ranks[0],
            "kv_params": {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": port,
                          "remote_request_id": "r1", "remote_engine_id": "p_dp0"}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_and_b_refuse_each_others_kv_handshake(installed):
    a, b = installed["A"], installed["B"]
    assert a["compat"] != b["compat"]
    assert installed["bad-sla"]["compat"] == installed["bad-accuracy"]["compat"] == b["compat"]

    async def go():
        leases = kv.Leases(30, lambda rank: None)
        port = _free_port()
        chan = await kv.serve_side_channel("127.0.0.1", port, leases, b["compat"], b["release"])  # a B prefill
        try:
            leases.add("r1", 4096, 0, "engB_dp0")
            with pytest.raises(kv.KVPullError, match="compatibility") as refused:  # an A decode
                await kv.pull("127.0.0.1", port, "r1", "engB_dp0", a["compat"], release=a["release"])
            assert refused.value.compat_mismatch is True
            assert refused.value.remote_release == {"name": "B", "version": b["release"]["version"],
                                                    "vllm_version": b["vllm"]}
            # The lease is untouched by a refused handshake: a B decode still gets the KV.
            assert await kv.pull("127.0.0.1", port, "r1", "engB_dp0", b["compat"], release=b["release"]) == 4096
            # Other failures are not a release mismatch.
            with pytest.raises(kv.KVPullError, match="unknown or expired") as gone:
                await kv.pull("127.0.0.1", port, "r1", "engB_dp0", b["compat"], release=b["release"])
            assert gone.value.compat_mismatch is False
        finally:
            chan.close()
    asyncio.run(go())


def test_bad_sla_fails_a_20ms_tpot_gate_and_the_others_pass(installed, lab_profile):
    for name, info in installed.items():
        prof = engine_profile.load(lab_profile, release=info["release"])
        for spec in SPEC_TOKENS:
            tpot_ms = 1000 * engine_profile.expected_tpot_s(prof, running=8, num_speculative_tokens=spec)
            if name == "bad-sla":
                assert tpot_ms > 20 * 2, (name, spec, tpot_ms)  # not a near miss
            else:
                assert tpot_ms < 20, (name, spec, tpot_ms)
    # Release traits are defaults under the operator's profile: the file still wins.
    override = Path(lab_profile).with_name("override.yml")
    override.write_text(stage.ENGINE_PROFILE.replace("latency:\n", "latency:\n  decode_slowdown: 1.0\n"))
    prof = engine_profile.load(str(override), release=installed["bad-sla"]["release"])
    assert 1000 * engine_profile.expected_tpot_s(prof, 8, 1) < 20


def test_bad_accuracy_answers_wrongly(installed, lab_profile, tmp_path):
    prompts = ["question %d" % i for i in range(100)]
    entries = {answers.prompt_sha(p): {"correct": "ANSWER: A", "wrong": "ANSWER: B"} for p in prompts}
    key = tmp_path / "answer-key.json"
    key.write_text(json.dumps({"correct_rate": 0.9, "entries": entries}))  # the lab's key says 90% right
    profile_file = tmp_path / "profile.yml"
    profile_file.write_text(stage.ENGINE_PROFILE.replace("/etc/pdctl/engine/answer-key.json", str(key)))
    right = {}
    for name, info in installed.items():
        ans = engine_profile.load(str(profile_file), release=info["release"])["answers"]
        k = answers.AnswerKey(ans["key"], ans["correct_rate"], ans["mode"])
        right[name] = sum(k.answer(p)[1] == "ANSWER: A" for p in prompts)
    assert right["bad-accuracy"] == 0
    assert all(right[n] >= 80 for n in ("A", "B", "bad-sla")), right


# ---------------------------------------------------------------- the decode side counts cross-release pairs

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return lab_tokenizer.build(tmp_path_factory.mktemp("model"))


def _engine(model_dir, role: str, release: dict) -> Engine:
    a = engine_args.parse([str(model_dir), "--kv-transfer-config",
                           json.dumps({"kv_connector": "NixlConnector", "kv_role": role})])
    tok, template, max_len = load_model_dir(a.model, None)
    return Engine(a, engine_profile.load("", release=release), tok, template, max_len, release=release)


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_a_refused_cross_release_pull_is_counted_and_logged_once(installed, model_dir, caplog):
    a, b = installed["A"]["release"], installed["B"]["release"]

    async def go():
        producer = _engine(model_dir, "kv_producer", b)
        decode = _engine(model_dir, "kv_consumer", a)
        port = _free_port()
        chan = await kv.serve_side_channel("127.0.0.1", port, producer.leases, producer.compat, producer.release)
        try:
            producer.leases.add("r1", 1024, 0, "p_dp0")
            req = _pull_request(decode, port, pieces=3)
            with pytest.raises(RequestFailed):
                async for _ in decode.run(req):
                    pass
        finally:
            chan.close()
        return decode

    with caplog.at_level(logging.ERROR, logger="pdctl.lab.engine"):
        decode = asyncio.run(go())
    text = decode.metrics.render()
    assert _metric(text, "pdctl_lab_cross_release_pairs_total") == 1
    assert _metric(text, "vllm:nixl_num_failed_transfers_total") == 1  # still a failed transfer, as before
    lines = [r.getMessage() for r in caplog.records if "cross-release pair" in r.getMessage()]
    assert len(lines) == 1
    assert "decode release A (vLLM %s)" % a["vllm_version"] in lines[0]
    assert "prefill release B (vLLM %s)" % b["vllm_version"] in lines[0]


def test_a_same_release_pull_is_not_a_cross_release_pair(installed, model_dir):
    b = installed["B"]["release"]

    async def go():
        producer, decode = _engine(model_dir, "kv_producer", b), _engine(model_dir, "kv_consumer", b)
        port = _free_port()
        chan = await kv.serve_side_channel("127.0.0.1", port, producer.leases, producer.compat, producer.release)
        try:
            producer.leases.add("r1", 1024, 0, "p_dp0")
            req = _pull_request(decode, port, pieces=2)
            return decode, [e async for e in decode.run(req)]
        finally:
            chan.close()

    decode, events = asyncio.run(go())
    assert len(events) == 2
    text = decode.metrics.render()
    assert "# TYPE pdctl_lab_cross_release_pairs_total counter" in text  # exists at 0 before any mismatch
    assert _metric(text, "pdctl_lab_cross_release_pairs_total") == 0
    assert _metric(text, "vllm:nixl_num_failed_transfers_total") == 0


def test_version_endpoint_and_info_metric_report_the_impersonated_vllm(installed, model_dir):
    b = installed["B"]["release"]
    engine = _engine(model_dir, "kv_producer", b)

    class Request:
        app = {"engine": engine}

    resp = asyncio.run(handle_version(Request()))
    assert json.loads(resp.text) == {"version": b["vllm_version"]}
    info = [line for line in engine.metrics.render().splitlines() if line.startswith("pdctl_lab_engine_info{")]
    assert info == ['pdctl_lab_engine_info{model_name="%s",version="%s",release="B",standin_version="%s"} 1.0'
                    % (engine.model_name, b["vllm_version"], b["version"])]
    # vLLM's own names are untouched: every series that is not vLLM's or the process' is lab-prefixed.
    for line in engine.metrics.render().splitlines():
        if not line.startswith("#"):
            assert line.startswith(("vllm:", "process_", "pdctl_lab_")), line


# ---------------------------------------------------------------- inventory names, locks, cache key

@pytest.mark.parametrize("versions, message", [
    ({"A": "0.1.0", "B": "0.2.0", "bad-sla": "0.2.1"}, "the stand-in has releases"),
    ({"A": "0.1.0", "B": "0.2.0", "bad-sla": "0.2.1", "bad-accuracy": "0.2.1"}, "share version 0.2.1"),
    ({"A": "0.1.0", "B": "v2", "bad-sla": "0.2.1", "bad-accuracy": "0.2.2"}, "not a PEP 440"),
    (["0.1.0"], "must be a map"),
])
def test_release_names_are_validated(versions, message):
    with pytest.raises(releases.ReleaseError, match=message):
        releases.identities(versions)


def test_each_release_has_its_own_lock_and_the_cache_key_follows_identities(tmp_path, monkeypatch):
    monkeypatch.setattr(stage.image, "cache_dir", lambda: tmp_path / "cache")
    monkeypatch.setattr(stage.wheelhouse, "download", fake_download)
    (tmp_path / "cache").mkdir()
    (tmp_path / "lab" / "store").mkdir(parents=True)
    stage.ensure_wheels(tmp_path / "lab", ROOT / "inventories" / "lab")
    store = tmp_path / "lab" / "store" / "wheels"
    first = Path(os.readlink(store))
    versions = _lab_releases()
    for name, version in versions.items():
        pins = wheelhouse.read_lock(store / wheelhouse.lock_name(releases.lock_set(version)))
        assert pins["pdctl-lab-engine"][0] == version and "nixl-cu13" in pins, name
        (wheel,) = store.glob("pdctl_lab_engine-%s-*.whl" % version)
        assert pins["pdctl-lab-engine"][1] == [wheelhouse._sha256(wheel)], name
    assert releases.lock_set(versions["B"]) == "vllm-lab-0.2.0"
    # Today's name (the vllm role's default) is the deployed release, A unless the inventory says otherwise.
    pins = yaml.safe_load((ROOT / "inventories/b300/group_vars/all/versions.yml").read_text())["pdctl_versions"]
    deployed = wheelhouse.read_lock(store / ("requirements-vllm-%s.txt" % pins["vllm"]))
    assert deployed["pdctl-lab-engine"][0] == versions["A"]

    # A release whose identity changes (same names, same versions) is a new wheelhouse.
    monkeypatch.setitem(releases.TRAITS, "B", {"vllm_version": "0.35.0", "profile": {}})
    stage.ensure_wheels(tmp_path / "lab", ROOT / "inventories" / "lab")
    second = Path(os.readlink(store))
    assert second != first and (first / ".complete").exists()
    with zipfile.ZipFile(next(second.glob("pdctl_lab_engine-%s-*.whl" % versions["B"]))) as zf:
        assert b"0.35.0" in zf.read("pdctl/lab/engine/_release.py")
