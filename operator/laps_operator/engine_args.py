"""Container command lines rendered from the LAPS knobs (pure).

Builtin engines and the gateway take the flags of docs/contracts.md; the `sglang` backend takes
SGLang's own launcher with the LAPS flags of the reference patches.
"""
from __future__ import annotations

from .naming import BOOTSTRAP_PORT, ENGINE_PORT, LABELS_FILE, ClusterRef
from .spec import ClusterSpec


def _csv(values: tuple[int, ...]) -> str:
    return ",".join(str(v) for v in values)


def _fmt(value: float) -> str:
    # 5.0 -> "5.0", 2000.0 -> "2000.0": keeps floats recognisable to argparse(type=float).
    return repr(float(value))


def builtin_engine_command(spec: ClusterSpec, role: str) -> tuple[list[str], list[str]]:
    """(command, args) of `laps engine` for role prefill|decode."""
    laps, sched, graphs = spec.laps, spec.laps.scheduler, spec.laps.batch_prefill_graphs
    args = [
        "engine",
        "--model", spec.model.path,
        "--served-model-name", spec.model.served,
        "--role", role,
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
        "--device", spec.engine.device,
        "--length-threshold", str(laps.length_threshold),
        "--drain-grace-s", _fmt(spec.drain.process_grace_seconds),
    ]
    if spec.engine.max_queued_requests is not None:
        args += ["--max-queued-requests", str(spec.engine.max_queued_requests)]
    if role == "prefill":
        args += [
            "--bootstrap-port", str(BOOTSTRAP_PORT),
            "--laps-scheduler" if sched.enabled else "--no-laps-scheduler",
            "--wait-window-ms", _fmt(sched.wait_window_ms),
            "--wait-max-batch", str(sched.wait_max_batch),
            "--adaptive-window" if sched.adaptive_window else "--no-adaptive-window",
            "--max-long-wait-ms", _fmt(sched.max_long_wait_ms),
            "--batch-prefill-graphs" if graphs.enabled else "--no-batch-prefill-graphs",
            "--batch-prefill-graphs-batch-sizes", _csv(graphs.batch_sizes),
            "--batch-prefill-graphs-seq-lengths", _csv(graphs.seq_lengths),
            "--labels-file", LABELS_FILE,
        ]
    return ["laps"], args + list(spec.engine.extra_args)


def sglang_engine_command(spec: ClusterSpec, role: str) -> tuple[list[str], list[str]]:
    """(command, args) of `python -m sglang.launch_server` with the LAPS patches' flags."""
    pool = spec.prefill if role == "prefill" else spec.decode
    laps, sched, graphs = spec.laps, spec.laps.scheduler, spec.laps.batch_prefill_graphs
    args = [
        "--model-path", spec.model.path,
        "--served-model-name", spec.model.served,
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
        "--disaggregation-mode", role,
        "--tp-size", str(pool.tensor_parallel_size),
        "--enable-metrics",
    ]
    if role == "prefill":
        args += ["--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT)]
        if sched.enabled:
            # SGLang ignores the LAPS scheduler outside prefill mode, so only prefill gets it.
            args += [
                "--enable-laps-scheduler",
                "--laps-length-threshold", str(laps.length_threshold),
                "--laps-wait-window-ms", _fmt(sched.wait_window_ms),
                "--laps-wait-max-batch", str(sched.wait_max_batch),
            ]
        if graphs.enabled:
            # SGLang's list options are argparse nargs="+": one value per word.
            args += ["--enable-batch-prefill-cuda-graph", "--batch-prefill-max-seq-len", str(max(graphs.seq_lengths))]
            args += ["--batch-prefill-batch-sizes", *map(str, graphs.batch_sizes)]
            args += ["--batch-prefill-seq-lengths", *map(str, graphs.seq_lengths)]
    return ["python", "-m", "sglang.launch_server"], args + list(spec.engine.extra_args)


def engine_command(spec: ClusterSpec, role: str) -> tuple[list[str], list[str]]:
    if spec.engine.backend == "sglang":
        return sglang_engine_command(spec, role)
    return builtin_engine_command(spec, role)


def gateway_command(spec: ClusterSpec, cluster: ClusterRef) -> tuple[list[str], list[str]]:
    args = [
        "gateway",
        "--host", "0.0.0.0",
        "--port", str(spec.gateway.port),
        "--length-threshold", str(spec.laps.length_threshold),
        "--served-model-name", spec.model.served,
        "--request-deadline-s", _fmt(spec.gateway.request_deadline_seconds),
        "--drain-grace-s", _fmt(spec.drain.process_grace_seconds),
    ]
    if model_visible_to_gateway(spec):
        args += ["--tokenizer", spec.model.path]
    args += [
        "--discovery", "kubernetes",
        "--namespace", cluster.namespace,
        "--prefill-short-service", cluster.prefill_group_service("short"),
        "--prefill-long-service", cluster.prefill_group_service("long"),
        "--decode-service", cluster.decode,
    ]
    return ["laps"], args


def model_visible_to_gateway(spec: ClusterSpec) -> bool:
    """The gateway can read the model's tokenizer when the model lives on a volume (mounted in
    the gateway too) or in the image the gateway shares with builtin engines."""
    return spec.model.volume is not None or spec.engine.image == spec.gateway.image
