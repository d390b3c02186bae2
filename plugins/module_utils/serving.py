# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How a planned instance is started: its argv and environment, and systemd quoting.

The pool's tuning flags come from the inventory (`pdctl_serve_args`, the recipe's flags verbatim);
this module adds only what the plan decides per instance: parallel sizes, the API port and the DP
RPC port on the command line; the GPU mask and the NIXL side channel in the environment.
"""
from __future__ import annotations

# Flags the plan owns: an inventory that sets them in pdctl_serve_args is rejected (one source).
PLAN_FLAGS = ("-tp", "--tensor-parallel-size", "-dp", "--data-parallel-size", "--port",
              "--data-parallel-rpc-port", "--host")


class ServingError(ValueError):
    pass


def serve_argv(instance, engine_command, serve_args):
    """argv of one instance: engine command, `serve`, model, the pool's flags, the plan's flags."""
    pool_args = [str(a) for a in (serve_args or {}).get(instance["pool"]) or []]
    if not pool_args:
        raise ServingError("pdctl_serve_args has no flags for pool %r" % instance["pool"])
    for arg in pool_args:
        if arg.split("=", 1)[0] in PLAN_FLAGS:
            raise ServingError("pdctl_serve_args.%s sets %s, which the plan decides per instance"
                               % (instance["pool"], arg.split("=", 1)[0]))
    return ([str(c) for c in engine_command] + ["serve", instance["model_path"]] + pool_args
            + ["-tp", str(instance["tensor_parallel_size"]), "-dp", str(instance["data_parallel_size"]),
               "--port", str(instance["api_port"]), "--data-parallel-rpc-port", str(instance["dp_rpc_port"])])


def in_venv(command, venv):
    """Resolve a command's first word in the venv's bin/ unless it is an absolute path."""
    command = [str(c) for c in command]
    if command and not command[0].startswith("/"):
        command[0] = "%s/bin/%s" % (str(venv).rstrip("/"), command[0])
    return command


def check_argv(instance, engine, serve_args, venv):
    """The engine's argument checker run on exactly what the instance will be started with."""
    argv = serve_argv(instance, engine["command"], serve_args)
    return in_venv(engine["check_args"], venv) + argv[len(engine["command"]):]


def serve_environment(instance, base_env=None):
    """Environment of one instance (no secrets: those live in the protected secrets file)."""
    env = {str(k): str(v) for k, v in (base_env or {}).items()}
    env.update({
        "CUDA_VISIBLE_DEVICES": instance["cuda_visible_devices"],
        "VLLM_NIXL_SIDE_CHANNEL_HOST": instance["side_channel_host"],
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(instance["side_channel_port"]),
    })
    # The KV NICs nearest the instance's GPUs (the plan, from the hardware profile) replace any
    # site-wide device list.
    if instance.get("ucx_net_devices"):
        env["UCX_NET_DEVICES"] = instance["ucx_net_devices"]
    return env


def systemd_quote(argv):
    """An ExecStart= command line: each word double-quoted where needed; % and $ escaped."""
    out = []
    for word in argv:
        word = str(word).replace("%", "%%")
        if word.startswith("${") and word.endswith("}"):  # an environment reference we mean to expand
            out.append(word)
            continue
        word = word.replace("$", "$$")
        if word and all(c.isalnum() or c in "-_./:=,+@" for c in word):
            out.append(word)
        else:
            out.append('"%s"' % word.replace("\\", "\\\\").replace('"', '\\"'))
    return " ".join(out)


def env_file(env):
    """systemd EnvironmentFile= text, one KEY="value" per line."""
    lines = []
    for key in sorted(env):
        value = str(env[key]).replace("\\", "\\\\").replace('"', '\\"')
        lines.append('%s="%s"' % (key, value))
    return "\n".join(lines) + "\n"


def shutdown_timeout(args):
    """The --shutdown-timeout a pool's args set (the last one wins, as with argparse); 0 (vLLM's default:
    abort at once) when none. Raises ServingError on a value that is not a whole number of seconds."""
    value = "0"
    for i, word in enumerate(args or []):
        word = str(word)
        if word == "--shutdown-timeout" and i + 1 < len(args):
            value = str(args[i + 1])
        elif word.startswith("--shutdown-timeout="):
            value = word.split("=", 1)[1]
    if not value.strip().isdigit():
        raise ServingError("--shutdown-timeout must be a whole number of seconds, found %r" % value)
    return int(value)


def stop_timeout_problems(serve_args, stop_timeout_s):
    """Why the units' TimeoutStopSec (stop_timeout_s) does not outlast every pool's drain: systemd sends
    SIGKILL at TimeoutStopSec, so a stop timeout at or below --shutdown-timeout cuts the drain short and
    aborts the requests still in flight. [] when it outlasts them all."""
    try:
        stop = int(str(stop_timeout_s))
    except ValueError:
        return ["pdctl_serve_stop_timeout_s must be a whole number of seconds, found %r" % (stop_timeout_s,)]
    problems = []
    for pool in sorted(serve_args or {}):
        try:
            drain = shutdown_timeout(serve_args[pool])
        except ServingError as exc:
            problems.append("pdctl_serve_args.%s: %s" % (pool, exc))
            continue
        if stop <= drain:
            problems.append("pdctl_serve_stop_timeout_s (the units' TimeoutStopSec) is %d s, not longer than the "
                            "%s pool's --shutdown-timeout %d s: systemd would kill an instance before its drain "
                            "ends; set it above %d" % (stop, pool, drain, drain))
    return problems
