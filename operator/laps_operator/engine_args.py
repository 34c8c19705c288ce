"""Container command lines rendered from the LAPS knobs (pure).

Builtin engines and the gateway take the flags of docs/contracts.md; the `sglang` backend takes
a stock SGLang launcher, with the LAPS plugin configured through the environment.
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
        # Decode engines keep no cache either way; the flag says the same on every pod.
        "--prefix-cache" if laps.prefix_cache else "--no-prefix-cache",
        # Prefill engines compute the KV decode engines send back; decode engines send it.
        "--prefix-warm" if spec.warm else "--no-prefix-warm",
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
    """(command, args) of a stock `python3 -m sglang.launch_server` (no fork flags: SGLang's
    parser rejects unknown ones). The LAPS knobs reach the plugin as environment variables
    (`sglang_plugin_env`)."""
    pool = spec.prefill if role == "prefill" else spec.decode
    args = [
        "--model-path", spec.model.path,
        "--served-model-name", spec.model.served,
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
        "--disaggregation-mode", role,
        "--disaggregation-transfer-backend", spec.engine.sglang.transfer_backend,
        "--tp-size", str(pool.tensor_parallel_size),
        # The plugin's laps_engine_* series join SGLang's own on this server's /metrics.
        "--enable-metrics",
    ]
    if not spec.laps.prefix_cache:
        # SGLang's radix cache is on unless disabled (it has no positive flag); both roles.
        args.append("--disable-radix-cache")
    if role == "prefill":
        args += ["--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT)]
        graphs = spec.laps.batch_prefill_graphs
        if graphs.enabled and spec.engine.device != "cpu":
            args += ["--cuda-graph-config", sglang_prefill_graph_config(graphs.batch_sizes, graphs.seq_lengths)]
    return ["python3", "-m", "sglang.launch_server"], args + list(spec.engine.extra_args)


def sglang_prefill_graph_config(batch_sizes: tuple[int, ...], seq_lengths: tuple[int, ...]) -> str:
    """SGLang's own multi-request prefill graphs for the CR's bucket grid (README, "Batch-prefill
    CUDA graphs and SGLang"): its `full` prefill backend captures the whole transformer body
    per *total-token* bucket with a fixed number of request slots, so the (batch, length) grid
    becomes the set of products b*s and max(batch sizes) slots. No hook needed."""
    import json

    tokens = sorted({b * s for b in batch_sizes for s in seq_lengths})
    prefill = {"backend": "full", "bs": tokens, "full_prefill_max_req": max(batch_sizes)}
    return json.dumps({"prefill": prefill}, separators=(",", ":"))


def sglang_plugin_env(spec: ClusterSpec, role: str) -> list[dict[str, str]]:
    """The LAPS plugin's configuration (laps_agent/sglang_plugin/settings.py), prefill only:
    the plugin schedules nothing elsewhere, and decode pods then run vanilla SGLang."""
    if spec.engine.backend != "sglang" or role != "prefill":
        return []
    laps, sched = spec.laps, spec.laps.scheduler
    values = {
        "LAPS_SCHEDULER": "1" if sched.enabled else "0",
        "LAPS_LENGTH_THRESHOLD": str(laps.length_threshold),
        "LAPS_WAIT_WINDOW_MS": _fmt(sched.wait_window_ms),
        "LAPS_WAIT_MAX_BATCH": str(sched.wait_max_batch),
        "LAPS_ADAPTIVE_WINDOW": "1" if sched.adaptive_window else "0",
        "LAPS_MAX_LONG_WAIT_MS": _fmt(sched.max_long_wait_ms),
        "LAPS_LABELS_FILE": LABELS_FILE,
    }
    return [{"name": k, "value": v} for k, v in values.items()]


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
        "--prefix-affinity" if spec.laps.affinity else "--no-prefix-affinity",
        "--prefix-warm" if spec.warm else "--no-prefix-warm",
    ]
    if spec.gateway.max_pending_tokens_per_pod is not None:
        args += ["--max-pending-tokens-per-pod", str(spec.gateway.max_pending_tokens_per_pod)]
    if spec.gateway.max_decode_share is not None:
        args += ["--max-decode-share", _fmt(spec.gateway.max_decode_share)]
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
