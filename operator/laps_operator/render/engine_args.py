"""Container command lines rendered from the LAPS knobs (pure).

Builtin engines and the gateway take the flags of docs/contracts.md; the `sglang` backend takes
a stock SGLang launcher, with the LAPS plugin configured through the environment.

The engines' flags are listed once, as `Owned` entries that also say which CR field each comes
from: the command line is rendered from them, and engine.extraArgs may not repeat one
(overrides.py), since the last occurrence wins and would silently undo the CR.
"""
from __future__ import annotations

from dataclasses import dataclass

from laps_agent.policy.classes import LONG, SHORT
from laps_agent.serving.flag_types import slo_text
from laps_operator.naming import BOOTSTRAP_PORT, ENGINE_PORT, GATEWAY_PORT, LABELS_FILE, ClusterRef
from laps_operator.spec.cluster import ClusterSpec


@dataclass(frozen=True)
class Owned:
    """A flag the operator sets: every spelling the engine's parser takes for it, the CR field
    it comes from (None: fixed by the operator, e.g. the ports the Services and probes use), and
    what it renders (nothing this time, for a field left unset: the flag stays the field's)."""
    names: tuple[str, ...]
    field: str | None
    tokens: tuple[str, ...] = ()


def _opt(name: str, value: object, field: str | None, *aliases: str) -> Owned:
    return Owned((name, *aliases), field, (name, str(value)))


def _switch(name: str, on: bool, field: str) -> Owned:
    # argparse.BooleanOptionalAction: --x and --no-x are the one flag.
    negative = "--no-" + name.removeprefix("--")
    return Owned((name, negative), field, (name if on else negative,))


def _ttft_slo_text(spec: ClusterSpec) -> str:
    """spec.slo.ttftP90Seconds as the --slo text (LAPS_SLO's too) the gateway and the engines read."""
    ttft = spec.slo.ttft_p90_seconds
    return slo_text({SHORT: ttft.short, LONG: ttft.long})


def _csv(values: tuple[int, ...]) -> str:
    return ",".join(str(v) for v in values)


def _fmt(value: float) -> str:
    # 5.0 -> "5.0", 2000.0 -> "2000.0": keeps floats recognisable to argparse(type=float).
    return repr(float(value))


def _builtin_owned(spec: ClusterSpec, role: str) -> list[Owned]:
    laps, sched, graphs = spec.laps, spec.laps.scheduler, spec.laps.batch_prefill_graphs
    queued = spec.engine.max_queued_requests
    owned = [
        _opt("--model", spec.model.path, "model.path"),
        _opt("--served-model-name", spec.model.served, "model.servedName"),
        _opt("--role", role, None),
        _opt("--host", "0.0.0.0", None),
        _opt("--port", ENGINE_PORT, None),
        _opt("--device", spec.engine.device, "engine.device"),
        _opt("--length-threshold", laps.length_threshold, "laps.lengthThreshold"),
        _opt("--drain-grace-s", _fmt(spec.drain.process_grace_seconds), "drain.gracePeriodSeconds"),
        # Decode engines keep no cache either way; the flag says the same on every pod.
        _switch("--prefix-cache", laps.prefix_cache, "laps.prefixCache"),
        # Prefill engines compute the KV decode engines send back; decode engines send it.
        _switch("--prefix-warm", spec.warm, "laps.prefixWarm"),
        Owned(("--max-queued-requests",), "engine.maxQueuedRequests",
              () if queued is None else ("--max-queued-requests", str(queued))),
    ]
    if role == "prefill":
        owned += [
            _opt("--bootstrap-port", BOOTSTRAP_PORT, None),
            _switch("--laps-scheduler", sched.enabled, "laps.scheduler.enabled"),
            _opt("--wait-window-ms", _fmt(sched.wait_window_ms), "laps.scheduler.waitWindowMs"),
            _opt("--wait-max-batch", sched.wait_max_batch, "laps.scheduler.waitMaxBatch"),
            _switch("--adaptive-window", sched.adaptive_window, "laps.scheduler.adaptiveWindow"),
            _opt("--max-long-wait-ms", _fmt(spec.max_long_wait_ms), "laps.scheduler.maxLongWaitMs"),
            _opt("--max-long-batch-tokens", sched.max_long_batch_tokens, "laps.scheduler.maxLongBatchTokens"),
            _switch("--batch-prefill-graphs", graphs.enabled, "laps.batchPrefillGraphs.enabled"),
            _opt("--batch-prefill-graphs-batch-sizes", _csv(graphs.batch_sizes), "laps.batchPrefillGraphs.batchSizes"),
            _opt("--batch-prefill-graphs-seq-lengths", _csv(graphs.seq_lengths), "laps.batchPrefillGraphs.seqLengths"),
            _opt("--labels-file", LABELS_FILE, None),
        ]
    else:   # decode: the LAPS scheduler orders decode admission by the TTFT SLOs (decode_order.py)
        owned += [
            _switch("--laps-scheduler", sched.enabled, "laps.scheduler.enabled"),
            _opt("--slo", _ttft_slo_text(spec), "slo.ttftP90Seconds"),
        ]
    return owned


def _sglang_owned(spec: ClusterSpec, role: str) -> list[Owned]:
    """SGLang's flags (stock SGLang: no fork flags, its parser rejects unknown ones), with the
    aliases its parser also takes."""
    pool = spec.prefill if role == "prefill" else spec.decode
    device = spec.engine.device
    owned = [
        _opt("--model-path", spec.model.path, "model.path", "--model"),
        _opt("--served-model-name", spec.model.served, "model.servedName"),
        _opt("--host", "0.0.0.0", None),
        _opt("--port", ENGINE_PORT, None),
        _opt("--disaggregation-mode", role, None),
        _opt("--disaggregation-transfer-backend", spec.engine.sglang.transfer_backend, "engine.sglang.transferBackend"),
        _opt("--tp-size", pool.tensor_parallel_size, "prefill.tensorParallelSize, decode.tensorParallelSize",
             "--tensor-parallel-size"),
        # The plugin's laps_engine_* series join SGLang's own on this server's /metrics.
        Owned(("--enable-metrics",), None, ("--enable-metrics",)),
        # SGLang's radix cache is on unless disabled (it has no positive flag); both roles.
        Owned(("--disable-radix-cache",), "laps.prefixCache",
              () if spec.laps.prefix_cache else ("--disable-radix-cache",)),
    ]
    # The pod holds GPUs on cuda and auto and none on cpu (gpus.py): SGLang must use what it got.
    # On auto it is left to pick among them, so --device in extraArgs is refused on every device.
    owned.append(Owned(("--device",), "engine.device", () if device == "auto" else ("--device", device)))
    if role == "prefill":
        owned.append(_opt("--disaggregation-bootstrap-port", BOOTSTRAP_PORT, None))
        graphs = spec.laps.batch_prefill_graphs
        if graphs.enabled and device != "cpu":
            # Only while rendered: with batchPrefillGraphs off, extraArgs may carry the user's own.
            owned.append(_opt("--cuda-graph-config", sglang_prefill_graph_config(graphs.batch_sizes, graphs.seq_lengths),
                              "laps.batchPrefillGraphs (enabled: false leaves it to engine.extraArgs)"))
    return owned


def owned_engine_flags(spec: ClusterSpec, role: str) -> list[Owned]:
    """The flags the operator sets on `role`'s engines, in the order it renders them."""
    return _sglang_owned(spec, role) if spec.engine.backend == "sglang" else _builtin_owned(spec, role)


def _render(spec: ClusterSpec, role: str) -> list[str]:
    return [token for owned in owned_engine_flags(spec, role) for token in owned.tokens] + list(spec.engine.extra_args)


def builtin_engine_command(spec: ClusterSpec, role: str) -> tuple[list[str], list[str]]:
    """(command, args) of `laps engine` for role prefill|decode."""
    return ["laps"], ["engine", *_render(spec, role)]


def sglang_engine_command(spec: ClusterSpec, role: str) -> tuple[list[str], list[str]]:
    """(command, args) of a stock `python3 -m sglang.launch_server`. The LAPS knobs reach the
    plugin as environment variables (`sglang_plugin_env`)."""
    return ["python3", "-m", "sglang.launch_server"], _render(spec, role)


def sglang_prefill_graph_config(batch_sizes: tuple[int, ...], seq_lengths: tuple[int, ...]) -> str:
    """SGLang's own multi-request prefill graphs for the CR's bucket grid (docs/sglang.md, "Batch-prefill
    CUDA graphs and SGLang"): its `full` prefill backend captures the whole transformer body
    per *total-token* bucket with a fixed number of request slots, so the (batch, length) grid
    becomes the set of products b*s and max(batch sizes) slots. No hook needed."""
    import json

    tokens = sorted({b * s for b in batch_sizes for s in seq_lengths})
    prefill = {"backend": "full", "bs": tokens, "full_prefill_max_req": max(batch_sizes)}
    return json.dumps({"prefill": prefill}, separators=(",", ":"))


def plugin_env_fields(spec: ClusterSpec, role: str = "prefill") -> dict[str, tuple[str | None, str]]:
    """The LAPS plugin's variables (laps_agent/sglang_plugin/settings.py) on `role`'s pods:
    name -> (the CR field it comes from, or None, and its value). A decode server takes only
    what orders its decode slots (the plugin's decode order)."""
    laps, sched = spec.laps, spec.laps.scheduler
    both = {
        "LAPS_SCHEDULER": ("laps.scheduler.enabled", "1" if sched.enabled else "0"),
        "LAPS_LENGTH_THRESHOLD": ("laps.lengthThreshold", str(laps.length_threshold)),
    }
    if role == "decode":
        return {**both, "LAPS_SLO": ("slo.ttftP90Seconds", _ttft_slo_text(spec))}
    return {
        **both,
        "LAPS_WAIT_WINDOW_MS": ("laps.scheduler.waitWindowMs", _fmt(sched.wait_window_ms)),
        "LAPS_WAIT_MAX_BATCH": ("laps.scheduler.waitMaxBatch", str(sched.wait_max_batch)),
        "LAPS_ADAPTIVE_WINDOW": ("laps.scheduler.adaptiveWindow", "1" if sched.adaptive_window else "0"),
        "LAPS_MAX_LONG_WAIT_MS": ("laps.scheduler.maxLongWaitMs", _fmt(spec.max_long_wait_ms)),
        "LAPS_MAX_LONG_BATCH_TOKENS": ("laps.scheduler.maxLongBatchTokens", str(sched.max_long_batch_tokens)),
        "LAPS_LABELS_FILE": (None, LABELS_FILE),
    }


def sglang_plugin_env(spec: ClusterSpec, role: str) -> list[dict[str, str]]:
    """The plugin's configuration: prefill pods schedule prefill batches, decode pods order
    their decode slots."""
    if spec.engine.backend != "sglang":
        return []
    return [{"name": name, "value": value} for name, (_, value) in plugin_env_fields(spec, role).items()]


def engine_command(spec: ClusterSpec, role: str) -> tuple[list[str], list[str]]:
    if spec.engine.backend == "sglang":
        return sglang_engine_command(spec, role)
    return builtin_engine_command(spec, role)


def gateway_command(spec: ClusterSpec, cluster: ClusterRef) -> tuple[list[str], list[str]]:
    args = [
        "gateway",
        "--host", "0.0.0.0",
        # A fixed unprivileged port: the Service maps gateway.port onto it (builders.py), so a
        # port below 1024 needs no root or NET_BIND_SERVICE (pod_security.py drops them).
        "--port", str(GATEWAY_PORT),
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
    # The SLOs the planner sizes for are the ones the gateway places by (policy/placement.py).
    args += ["--slo", _ttft_slo_text(spec)]
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
