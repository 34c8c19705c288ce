"""One simulated run (`simulate`) and the baseline's capacity (`measure_capacity`) that `--load`
scales by: what `laps sim`, its matrix (matrix.py) and `laps bench compare` call."""
from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Mapping

import numpy as np

from laps_agent.emulated.profile import Profile
from laps_agent.lab.results import (
    RequestTable,
    RunResult,
)
from laps_agent.lab.results.turns import ORACLE_LABEL, pod_load
from laps_agent.lab.sim import allocation
from laps_agent.lab.sim.autoscale import Scaling, sizing_meta
from laps_agent.lab.sim.cluster import HOP_S, SimCluster, chars4_estimate
from laps_agent.lab.workload.conversations import oracle_cached_tokens
from laps_agent.lab.workload.plan import Plan, plan_requests, require_requests
from laps_agent.lab.workload.prompts import PromptBuilder
from laps_agent.lab.workload.spec import WorkloadSpec
from laps_agent.modelio.model_files import default_model_path
from laps_agent.modelio.tokenizer import load_tokenizer
from laps_agent.policy.classes import LONG, SHORT, is_short
from laps_agent.policy.systems import SYSTEMS, SystemConfig, moves_pods, system

_CAPACITY_REQUESTS_PER_POD = 200
# The multi-turn reference, only here: `laps` over one unlimited prefix cache that every prefill
# pod shares and the router knows (prefix.py). Not a system `laps local` can run.
# The oracle router: every earlier prompt cached everywhere, and nothing more (no warming).
ORACLE = dataclasses.replace(SYSTEMS["laps"], name=ORACLE_LABEL, prefix_warm=False)


def sim_system(name: str) -> SystemConfig:
    return ORACLE if name == ORACLE.name else system(name)


def simulate(plan: Plan, profile: Profile, sys_config: SystemConfig, *, prefill: int, decode: int,
             threshold: int, engine_args: tuple[str, ...] = (), label: str | None = None,
             chars_per_token: float | None = None, warmup: Plan | None = None,
             hop_s: float = HOP_S, allocation_config: allocation.AllocationConfig | None = None,
             interval_s: float = allocation.INTERVAL_S, scaling: Scaling | None = None,
             ttft_slo_s: Mapping[str, float] | None = None) -> RunResult:
    """One simulated run of `plan` on a cluster running `sys_config`, after `warmup` (requests
    replayed first on the same cluster and left out of the result, as `laps bench compare` warms
    each system up). `chars_per_token`: of the load generator's prompt text, for the reference's
    chars/4 estimate (default: measured on the default tokenizer's prompt builder, as
    `laps bench run` builds prompts). `ttft_slo_s`: the gateway's --slo (None: its default)."""
    estimate = None
    if sys_config.estimator == "chars4":
        estimate = chars4_estimate(chars_per_token or default_chars_per_token())
    cluster = SimCluster(profile, sys_config, prefill=prefill, decode=decode, threshold=threshold,
                         engine_args=engine_args, estimate=estimate, hop_s=hop_s, allocation=allocation_config,
                         interval_s=interval_s, oracle=sys_config.name == ORACLE.name, scaling=scaling,
                         ttft_slo_s=ttft_slo_s)
    skip, offset = 0, 0.0
    at, prompts, outputs_all, convs = plan.at, plan.prompt_tokens, plan.output_tokens, plan.conversation
    if warmup is not None and len(warmup):
        skip, offset = len(warmup), warmup.duration_s
        at = np.concatenate([warmup.at, plan.at + offset])
        prompts = np.concatenate([warmup.prompt_tokens, plan.prompt_tokens])
        outputs_all = np.concatenate([warmup.output_tokens, plan.output_tokens])
        # The warm-up's conversations must not share prefixes with the measured ones.
        shift = int(plan.conversation.max(initial=-1)) + 1
        convs = np.concatenate([np.where(warmup.conversation >= 0, warmup.conversation + shift, -1),
                                plan.conversation])
    started = time.perf_counter()
    outcome = cluster.run(at, prompts, outputs_all, convs)
    wall = time.perf_counter() - started
    reqs = outcome.requests[skip:]
    for r in reqs:  # measured from the start of the measured run
        r.sent -= offset
        r.first = None if r.first is None else r.first - offset
        r.done = None if r.done is None else r.done - offset
    utilisation = float(np.mean(outcome.prefill_busy)) / outcome.duration if outcome.duration else 0.0
    outcome.timeline = [dataclasses.replace(s, t=s.t - offset) for s in outcome.timeline if s.t >= offset]
    outcome.duration -= offset
    nan = float("nan")
    first = np.array([r.first if r.first is not None else nan for r in reqs])
    done = np.array([r.done if r.done is not None else nan for r in reqs])
    sent = plan.at.astype(float)
    outputs = plan.output_tokens.astype(np.int64)
    # What the engines gave (as `laps bench run` counts what arrives): fewer than asked where
    # prompt + output would pass the context.
    tokens = np.array([r.tokens for r in reqs], dtype=np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        itl = np.where(tokens > 1, (done - first) / (tokens - 1), nan)
    status = np.array([r.status for r in reqs], dtype=np.int64)
    names = np.array([w.name for w in plan.phases], dtype=object)
    table = RequestTable.from_columns(
        index=np.arange(len(plan)), phase=names[plan.phase] if len(plan) else np.array([], dtype=object),
        cls=np.where(is_short(plan.prompt_tokens, threshold), SHORT, LONG).astype(object),
        prompt_tokens=plan.prompt_tokens, output_tokens=outputs, sent_s=sent, status=status,
        error=np.array([r.error for r in reqs], dtype=object), ttft_s=first - sent, e2e_s=done - sent,
        tokens=tokens, itl_mean_s=itl,
        turn=np.where(plan.conversation >= 0, plan.turn, -1), cached_tokens=np.array([r.cached for r in reqs]))
    meta = {"label": label or sys_config.name, "tool": "laps sim", "target": "sim", "system": sys_config.name,
            "profile": profile.name, "profile_provenance": profile.provenance,
            "cluster": {"prefill": prefill, "decode": decode}, "threshold": threshold,
            "allocation": {"rule": sys_config.allocation if moves_pods(sys_config.allocation, not sys_config.groups,
                                                                     prefill) else "none",
                           "interval_s": cluster.interval_s, **dataclasses.asdict(cluster.allocation)},
            "workload": {"name": plan.spec.name, "spec": plan.spec.model_dump(mode="json")},
            "seed": plan.spec.seed, "rate_scale": plan.rate_scale, "phases": [w.to_dict() for w in plan.phases],
            "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "duration_s": outcome.duration, "sim_wall_s": wall,
            "prefill_utilisation": utilisation, "prefix": _prefix_meta(plan, cluster, outcome), "moves": [
                {"t": t - offset, "pod": m.pod, "from": m.source, "to": m.target} for t, m in cluster.moves]}
    if outcome.fleet is not None:
        meta["sizing"] = sizing_meta(outcome.fleet, outcome.scaler)
        for item in (*meta["sizing"]["decisions"], *meta["sizing"]["pods"]):
            item["t"] -= offset
    return RunResult(meta, table, outcome.timeline)


def _prefix_meta(plan: Plan, cluster: SimCluster, outcome) -> dict:
    """What the multi-turn report needs beyond the records (results/turns.py)."""
    block = cluster.prefixes.block_tokens
    oracle = oracle_cached_tokens(plan.prompt_tokens, plan.history_tokens, block)
    total = int(plan.prompt_tokens.sum())
    # Time in prefill batches of requests, as `laps bench` reads it from the engines
    # (laps_engine_prefill_latency_seconds): warms run only when a pod has nothing else to do.
    busy = {ep.name: b - w for ep, b, w in zip(cluster.prefill_eps, outcome.prefill_busy, outcome.prefill_warm)}
    groups = {g: [ep.name for ep in eps] for g, eps in cluster.groups.items() if eps}
    compute = sum(outcome.prefill_busy)
    return {"block_tokens": block, "oracle_hit_rate": float(oracle.sum() / total) if total else None,
            "warm_share": sum(outcome.prefill_warm) / compute if compute else 0.0,
            "pod_load": pod_load(busy, groups), "affinity": cluster.system.affinity}


def default_chars_per_token() -> float:
    return PromptBuilder(load_tokenizer(default_model_path()), 0).chars_per_token


def measure_capacity(spec: WorkloadSpec, profile: Profile, *, prefill: int, decode: int, threshold: int,
                     engine_args: tuple[str, ...] = ()) -> float:
    """Requests/s the baseline (`vanilla-pd`) sustains on this workload's length mix: the
    simulated throughput when a large batch of its requests all arrive at once (without the
    gateway's admission control, which would refuse most of such a burst at once: capacity is
    what the engines serve, not what the gateway turns away)."""
    n = max(2000, _CAPACITY_REQUESTS_PER_POD * prefill)
    base = len(plan_requests(spec))
    plan = plan_requests(spec, rate_scale=max(1.0, n / max(base, 1)), max_requests=n)
    zeros = np.zeros(len(plan))
    cluster = SimCluster(profile, SYSTEMS["vanilla-pd"], prefill=prefill, decode=decode, threshold=threshold,
                         engine_args=engine_args, sample_every_s=0, max_pending_tokens_per_pod=0)
    outcome = cluster.run(zeros, plan.prompt_tokens, plan.output_tokens)
    return len(plan) / outcome.duration if outcome.duration > 0 else float("inf")


def mean_rate(spec: WorkloadSpec) -> float:
    plan = require_requests(plan_requests(spec))  # --load scales this rate: 0 cannot be scaled
    return len(plan) / plan.duration_s if plan.duration_s > 0 else float("inf")
