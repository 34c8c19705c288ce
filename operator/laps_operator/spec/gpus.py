"""How many GPUs an engine pod holds (pure).

An engine uses a fixed number of GPUs: the builtin engine one; SGLang one per rank, and its
ranks are --tp-size (rendered from tensorParallelSize) times the pipeline stages and data-parallel
replicas that engine.extraArgs may ask for (its data-parallel controller gives each replica its
own tp x pp GPUs; attention data parallelism shares the tensor-parallel GPUs). Kubernetes hands
GPUs out whole (a request must equal the limit: formats.overcommittable), so a pod given fewer
cannot start its ranks and crash-loops, and a pod given more keeps GPUs on its node that nothing
uses. The operator therefore holds a pool's GPU count to what its engine uses: unset, it becomes
the limit; set otherwise, InvalidSpec names both fields. An engine on `device: cpu` (either
backend) holds none, and a count set for it is InvalidSpec too.
"""
from __future__ import annotations

from collections.abc import Sequence

from laps_operator.spec.formats import quantity
from laps_operator.spec.pods import EngineSpec, PoolSpec

GPU = "nvidia.com/gpu"

# What SGLang's parser reads as the options that decide its ranks beyond --tp-size, by SGLang's
# own dest: each option string it has (aliases too) -> the shortest abbreviation it takes for it
# (argparse takes any prefix no other SGLang option shares, and so every longer one: `--dp 2` is
# `--dp-size 2`). Read off SGLang 0.5.23's parser; tests/sglang/test_server_args.py holds the
# list to it, as the operator does not import SGLang.
SGLANG_SPELLINGS: dict[str, dict[str, str]] = {
    "pp_size": {"--pp-size": "--pp-s", "--pipeline-parallel-size": "--pi"},
    "dp_size": {"--dp-size": "--dp", "--data-parallel-size": "--da"},
    # --dp-size N --enable-dp-attention (attention data parallelism's older spelling) splits the
    # tensor-parallel GPUs instead of adding replicas (SGLang's _handle_deprecated_dp_attention;
    # beside --attn-dp-size > 1, SGLang refuses --dp-size > 1 and the pod says so in its log).
    "enable_dp_attention": {"--enable-dp-attention": "--enable-dp-attention"},
}


def _dest(name: str) -> str | None:
    """The SGLANG_SPELLINGS dest that option `name` (as written) sets, or None."""
    for dest, spellings in SGLANG_SPELLINGS.items():
        if any(full.startswith(name) and name.startswith(short) for full, short in spellings.items()):
            return dest
    return None


def _given(args: Sequence[str]) -> dict[str, tuple[str, int]]:
    """dest -> (the flag as written, its value) for the last occurrence of each dest in `args`
    (argparse keeps the last), `--f N` or `--f=N`; a switch's value is 1."""
    found = {}
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if not name.startswith("--") or (dest := _dest(name)) is None:
            continue
        if dest == "enable_dp_attention":
            found[dest] = (name, 1)
            continue
        value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
        if value.isdigit():
            found[dest] = (name, int(value))
    return found


def _multipliers(engine: EngineSpec) -> list[tuple[str, int]]:
    """The SGLang flags in engine.extraArgs that multiply a pod's GPUs, with their values."""
    if engine.backend != "sglang":
        return []
    given = _given(engine.extra_args)
    found = [given.get("pp_size")]
    if "enable_dp_attention" not in given:
        found.append(given.get("dp_size"))
    return [(flag, value) for flag, value in filter(None, found) if value > 1]


def engine_gpus(engine: EngineSpec, pool: PoolSpec) -> int | None:
    """GPUs one engine pod of `pool` uses, or None when the engine runs on the CPU."""
    if engine.device == "cpu":  # either backend: SGLang is told --device cpu too (engine_args.py)
        return None
    # Tensor parallelism needs SGLang (ClusterSpec): the builtin engine's is 1, one device.
    count = pool.tensor_parallel_size
    for _, value in _multipliers(engine):
        count *= value
    return count


def gpu_count_problem(role: str, engine: EngineSpec, pool: PoolSpec) -> str | None:
    """Why the GPU count `pool` asks for is not the one its engine uses, or None. No count (the
    operator then sets it, workloads.py) is fine; a CPU engine uses none."""
    asked = pool.resources.limits.get(GPU, pool.resources.requests.get(GPU))
    used = engine_gpus(engine, pool)
    if asked is None or quantity(asked) == (used or 0):
        return None
    if used is None:
        return (f"{role}.resources {GPU} ({asked}) with engine.device cpu: the engine would run on the CPU "
                f"while its GPUs sit idle on the node (leave {GPU} out, or set engine.device cuda)")
    how = "".join(f" x {flag} {value}" for flag, value in _multipliers(engine))
    how = f"{how} in engine.extraArgs = {used}" if how else ""
    return (f"{role}.resources {GPU} ({asked}) must equal {role}.tensorParallelSize ({pool.tensor_parallel_size})"
            f"{how}, the GPUs one engine uses: with fewer it cannot start, more would sit idle on the node "
            f"(leave {GPU} out and the operator sets it)")
