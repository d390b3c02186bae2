"""`pdctl render`: the units carry exactly the recipe's flags; the lab differs only where it must."""
import json
import re
import shlex

import pytest

from inventories import B300, PRODUCTION, ROOT
from pdctl import cli, inventory

RECIPE = (ROOT / "tests/fixtures/recipe-commands.txt").read_text()
PLAN_ADDED = {"--port", "--data-parallel-rpc-port"}  # what the plan adds per instance, nothing else
# The one deliberate change to a recipe flag (serving.yml says why): decode recomputes a prefill whose KV
# it could not load instead of failing the request.
KV_CONSUMER_ADDED = {"kv_load_failure_policy": "recompute"}


def recipe_command(pool):
    body = RECIPE.split("---%s---\n" % pool)[1].split("---")[0]
    return shlex.split(body.replace("\n", " "))


def deployed_flags(pool):
    """The recipe's flags as pdctl deploys them: verbatim but for KV_CONSUMER_ADDED on decode."""
    out = []
    for flag, value in flags(recipe_command(pool)):
        if flag == "--kv-transfer-config" and json.loads(value)["kv_role"] == "kv_consumer":
            value = json.dumps(dict(json.loads(value), **KV_CONSUMER_ADDED), separators=(",", ":"))
        out.append((flag, value))
    return out


def flags(argv):
    """[(flag, value-or-None)] from an argv after `serve MODEL`, `--a=b` split like argparse does."""
    words = argv[argv.index("serve") + 2:]
    out, i = [], 0
    while i < len(words):
        word = words[i]
        assert word.startswith("-"), "stray word %r in %r" % (word, words)
        if "=" in word:
            out.append(tuple(word.split("=", 1)))
            i += 1
        elif i + 1 < len(words) and not words[i + 1].startswith("-"):
            out.append((word, words[i + 1]))
            i += 2
        else:
            out.append((word, None))
            i += 1
    return sorted(out)


def exec_start(unit_text):
    line = next(l for l in unit_text.splitlines() if l.startswith("ExecStart="))
    return shlex.split(line[len("ExecStart="):].replace("%%", "%"))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """b300: the tests' three hosts (tests/fixtures/inventories); production: inventories/b300 itself, for the
    checks that hold for any number of hosts."""
    out = {}
    for inv, path in (("b300", B300), ("lab", ROOT / "inventories/lab"), ("production", PRODUCTION)):
        d = tmp_path_factory.mktemp(inv)
        assert cli.main(["render", "-i", str(path), "--out", str(d)]) == 0
        out[inv] = d
    return out


def units(root, pattern="pdctl-vllm-*.service"):
    return {p.name: p.read_text() for p in root.glob("*/etc/systemd/system/" + pattern)}


@pytest.mark.parametrize("pool", ["prefill", "decode"])
def test_rendered_flags_equal_the_recipe(rendered, pool):
    want = deployed_flags(pool)
    found = {name: text for name, text in units(rendered["production"]).items() if pool in name}
    assert len(found) == len([i for i in inventory.plan(PRODUCTION)["instances"] if i["pool"] == pool])
    for name, text in found.items():
        argv = exec_start(text)
        assert argv[0] == "/opt/pdctl/venvs/current/bin/vllm" and argv[1:3] == ["serve", "/mnt/model/glm/GLM-5.2-NVFP4"]
        got = flags(argv)
        assert {f for f, _ in got} - {f for f, _ in want} == PLAN_ADDED, name
        assert [fv for fv in got if fv[0] not in PLAN_ADDED] == want, name


def test_every_instance_gets_its_own_gpus_ports_and_side_channel(rendered):
    envs = {p.name: p.read_text() for p in rendered["b300"].glob("*/etc/pdctl/*.env")}
    assert len(envs) == 5
    for text in envs.values():
        assert 'VLLM_USE_V2_MODEL_RUNNER="1"' in text
        # Offline hosts: nothing reaches out at start (issue 13 item 5).
        for offline in ('HF_HUB_OFFLINE="1"', 'TRANSFORMERS_OFFLINE="1"', 'VLLM_NO_USAGE_STATS="1"'):
            assert offline in text
        assert re.search(r'VLLM_NIXL_SIDE_CHANNEL_HOST="192\.0\.2\.1[123]"', text)
    p1 = envs["prefill-1.env"]
    assert 'CUDA_VISIBLE_DEVICES="4,5,6,7"' in p1 and 'VLLM_NIXL_SIDE_CHANNEL_PORT="5604"' in p1
    assert 'CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7"' in envs["decode-0.env"]


def test_units_run_unprivileged_and_drain_before_kill(rendered):
    for name, text in units(rendered["production"]).items():
        assert "User=pdctl" in text and "LimitMEMLOCK=infinity" in text and "Restart=on-failure" in text
        stop = int(re.search(r"TimeoutStopSec=(\d+)", text).group(1))
        assert stop > 300, "%s: systemd must outwait --shutdown-timeout 300" % name
        assert not re.search(r"^(PrivateDevices|DevicePolicy)=", text, re.M), "GPU/RDMA devices must stay reachable"
        # SIGTERM to the API server only: vLLM's engine cores exit at once on SIGTERM (issue 13 item 4).
        assert re.findall(r"^KillMode=(.*)$", text, re.M) == ["mixed"], name


def test_router_is_pd_with_every_planned_upstream(rendered):
    (text,) = units(rendered["b300"], "pdctl-router.service").values()
    argv = exec_start(text)
    assert "--vllm-pd-disaggregation" in argv and argv[argv.index("--kv-connector") + 1] == "nixl"
    prefills = [argv[i + 1] for i, w in enumerate(argv) if w == "--prefill"]
    assert prefills == ["http://192.0.2.11:8100", "http://192.0.2.11:8101", "http://192.0.2.12:8100",
                        "http://192.0.2.12:8101"]
    assert [argv[i + 1] for i, w in enumerate(argv) if w == "--decode"] == ["http://192.0.2.13:8100"]
    # No key on the command line (world-readable in /proc/*/cmdline): the router reads OPENAI_API_KEY
    # from its 0600 environment file.
    assert not [w for w in argv if "key" in w.lower()], argv
    assert re.findall(r"^EnvironmentFile=(.*)$", text, re.M) == ["/etc/pdctl/router-secrets.env"]


def test_router_takes_a_dead_upstream_out_within_seconds(rendered):
    (text,) = units(rendered["b300"], "pdctl-router.service").values()
    argv = exec_start(text)

    def flag(name):
        return float(argv[argv.index(name) + 1])
    # vllm-router's defaults (a health check every 60 s) would send a crashed instance requests for a
    # minute; the role's settings take it out within interval x threshold <= 3 s and retry elsewhere.
    assert flag("--health-check-interval-secs") * flag("--health-failure-threshold") <= 3
    assert flag("--retry-max-retries") >= 2
    assert flag("--cb-failure-threshold") <= 3


def test_lab_units_differ_only_in_engine_and_addresses(rendered):
    def normalise(text, engine):
        text = text.replace(engine, "ENGINE")
        text = re.sub(r"^CPUAffinity=.*$", "CPUAffinity=(the lab's CPUs)", text, flags=re.M)
        text = re.sub(r"echo [0-9a-f]{16} ", "echo (the configuration's id) ", text)
        text = re.sub(r"(192\.0\.2|10\.89\.64)\.1([123])", r"ADDR\2", text)
        return re.sub(r"b300-|lab-", "HOST-", text)

    b300, lab = units(rendered["b300"]), units(rendered["lab"])
    assert b300.keys() == lab.keys()
    for name in b300:
        assert normalise(b300[name], "/opt/pdctl/venvs/current/bin/vllm") == \
            normalise(lab[name], "/opt/pdctl/venvs/current/bin/pdctl-lab-engine"), name


def test_render_rejects_an_invalid_inventory(tmp_path, capsys):
    from inventories import inventory_variant
    from malformed import CASES

    inv = inventory_variant(tmp_path / "inv", CASES[0][1])
    assert cli.main(["render", "-i", str(inv), "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the model (issue 13 item 6)

def test_units_name_nvidias_checkpoint_as_the_source(rendered):
    for inv in ("b300", "lab"):
        for name, text in units(rendered[inv]).items():
            assert "# weights: hf://nvidia/GLM-5.2-NVFP4 at /mnt/model/glm/GLM-5.2-NVFP4" in text, (inv, name)


# ---------------------------------------------------------------- KV NICs and CPUs follow the GPUs (item 2)

SWITCH_MGMT = {"mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5"}   # ConnectX-7 NVSwitch management ports (B300 profile)


def _env(root, name):
    text = next(root.glob("*/etc/pdctl/%s.env" % name)).read_text()
    return dict(re.findall(r'^(\w+)="(.*)"$', text, re.M))


def test_each_prefill_instance_uses_the_nics_and_cpus_of_its_own_socket(rendered):
    p0, p1 = _env(rendered["b300"], "prefill-0"), _env(rendered["b300"], "prefill-1")
    assert p0["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1,mlx5_6:1,mlx5_7:1"
    assert p1["UCX_NET_DEVICES"] == "mlx5_8:1,mlx5_9:1,mlx5_10:1,mlx5_11:1"
    for env in (p0, p1, _env(rendered["b300"], "decode-0")):
        assert not {d.split(":")[0] for d in env["UCX_NET_DEVICES"].split(",")} & SWITCH_MGMT
    u = units(rendered["b300"])
    aff = {n: re.findall(r"^CPUAffinity=(.*)$", u["pdctl-vllm-%s.service" % n], re.M) for n in ("prefill-0", "prefill-1")}
    assert aff == {"prefill-0": ["0-55,112-167"], "prefill-1": ["56-111,168-223"]}
    assert re.findall(r"^CPUAffinity=(.*)$", u["pdctl-vllm-decode-0.service"], re.M) == ["0-55,112-167 56-111,168-223"]


def test_lab_units_pin_instances_to_the_emulated_sockets_cpus(rendered):
    u = units(rendered["lab"])
    assert "CPUAffinity=0\n" in u["pdctl-vllm-prefill-0.service"] and "CPUAffinity=1\n" in u["pdctl-vllm-prefill-1.service"]
    assert _env(rendered["lab"], "prefill-1")["UCX_NET_DEVICES"] == "mlx5_8:1,mlx5_9:1,mlx5_10:1,mlx5_11:1"
