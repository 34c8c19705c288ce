"""Everything of SGLang the plugin touches, checked against the installed SGLang.

The plugin patches private methods of SGLang's scheduler, which SGLang may rename or re-sign in
any release. `check()` resolves each name and compares signatures before any hook is applied:
on a mismatch the plugin stays off (the server runs vanilla, with an error in its log naming
what changed) rather than corrupting scheduling; tests/sglang/test_compat.py fails on it.
Keep this list in step with hooks.py: every attribute hooks.py reads or calls is here. The
methods the plugin hooks are named here once (HOOK_*): __init__.py registers the hooks on them.
"""
from __future__ import annotations

import inspect
import pkgutil
from dataclasses import dataclass

PINNED = "0.5.23"  # pyproject.toml's `sglang` extra; tests/sglang/test_pin.py keeps them equal

# The methods hooked (hooks.py says what each hook does there):
# AROUND: LAPS picks the subset of waiting_queue SGLang builds a prefill batch from.
HOOK_NEW_BATCH = "sglang.srt.managers.scheduler.Scheduler._get_new_batch_prefill_raw"
# AFTER: a prefill batch's result (TTFT, batch latency, cost model).
HOOK_BATCH_RESULT = ("sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin"
                     ".process_batch_result_disagg_prefill")
# AFTER, in the tokenizer process: the arrival stamps travel with the request (SGLang 0.5.23
# stamps each request's arrival on the HTTP side but does not send the stamps to the scheduler).
HOOK_SEND_STAMPS = "sglang.srt.observability.req_time_stats.APIServerReqTimeStats.__getstate__"
# BEFORE, on a decode server: the requests whose KV arrived are put in deadline order
# (policy/scheduling/decode_order.py) before SGLang takes the first ones into its running batch.
HOOK_DECODE_ADMIT = ("sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin"
                     "._get_new_prebuilt_batch")
# A request's arrival, best first: SchedulerReqTimeStats fields (perf_counter seconds); the first
# two are the tokenizer side's (APIServerReqTimeStats), which HOOK_SEND_STAMPS sends along.
ARRIVAL_FIELDS = ("api_server_dispatch_time", "created_time", "prefill_bootstrap_queue_entry_time")


@dataclass(frozen=True)
class Callable_:
    target: str                  # dotted name
    params: tuple[str, ...]      # leading parameter names, in order (self included)


@dataclass(frozen=True)
class Attr:
    owner: str                   # dotted class name
    name: str                    # attribute set in __init__ (read from the source) or on the class


CALLABLES = (
    Callable_(HOOK_NEW_BATCH, ("self", "prefill_delayer_single_pass", "running_batch")),
    Callable_(HOOK_BATCH_RESULT, ("self", "batch", "result")),
    Callable_(HOOK_DECODE_ADMIT, ("self", "running_batch")),
    # The uncached-token count: SGLang's own radix-cache prefix match (as its LPM policy).
    Callable_("sglang.srt.mem_cache.common.match_kv_cache", ("req", "tree_cache", "token_ids")),
    Callable_("sglang.srt.constrained.grammar_manager.GrammarManager.has_waiting_grammars", ("self",)),
    Callable_(HOOK_SEND_STAMPS, ("self",)),
    Callable_("sglang.srt.observability.req_time_stats.SchedulerReqTimeStats.new_from_obj", ("obj",)),
    Callable_("sglang.srt.utils.common.broadcast_pyobj", ("data", "rank", "dist_group", "src")),
)
ATTRS = (
    Attr("sglang.srt.managers.scheduler.Scheduler", "waiting_queue"),
    Attr("sglang.srt.managers.scheduler.Scheduler", "chunked_req"),
    Attr("sglang.srt.managers.scheduler.Scheduler", "grammar_manager"),
    Attr("sglang.srt.managers.scheduler.Scheduler", "tree_cache"),
    Attr("sglang.srt.managers.scheduler.Scheduler", "disaggregation_mode"),
    Attr("sglang.srt.managers.scheduler.Scheduler", "server_args"),
    Attr("sglang.srt.managers.scheduler.Scheduler", "tp_size"),
    Attr("sglang.srt.managers.scheduler.Scheduler", "tp_group"),
    Attr("sglang.srt.managers.scheduler.Scheduler", "tp_cpu_group"),
    Attr("sglang.srt.managers.scheduler.Scheduler", "pool_stats_observer"),
    Attr("sglang.srt.managers.scheduler.Scheduler", "disagg_prefill_inflight_queue"),
    Attr("sglang.srt.managers.schedule_batch.Req", "rid"),
    Attr("sglang.srt.managers.schedule_batch.Req", "origin_input_ids"),
    Attr("sglang.srt.managers.schedule_batch.Req", "output_ids"),
    Attr("sglang.srt.managers.schedule_batch.Req", "prefix_len"),
    Attr("sglang.srt.managers.schedule_batch.Req", "inflight_middle_chunks"),
    Attr("sglang.srt.managers.schedule_batch.Req", "time_stats"),
    Attr("sglang.srt.managers.schedule_batch.Req", "retraction_count"),
    *(Attr("sglang.srt.observability.req_time_stats.SchedulerReqTimeStats", name) for name in ARRIVAL_FIELDS),
    *(Attr("sglang.srt.observability.req_time_stats.APIServerReqTimeStats", name) for name in ARRIVAL_FIELDS[:2]),
    Attr("sglang.srt.managers.schedule_batch.ScheduleBatch", "reqs"),
    Attr("sglang.srt.server_args.ServerArgs", "pp_size"),
    Attr("sglang.srt.server_args.ServerArgs", "served_model_name"),
)
ENUMS = (("sglang.srt.disaggregation.utils.DisaggregationMode", "PREFILL"),
         ("sglang.srt.disaggregation.utils.DisaggregationMode", "DECODE"))


def _assigned_in_class(cls: type, name: str) -> bool:
    """`name` is a class attribute, a dataclass field, a property, or `self.name = ...` /
    `self.name: T = ...` somewhere in the class's (or a base's) source."""
    for klass in cls.__mro__:
        if name in vars(klass) or name in getattr(klass, "__annotations__", {}):
            return True
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if f"self.{name} =" in source or f"self.{name}:" in source:
            return True
    return False


def problems() -> list[str]:
    """Every mismatch between this plugin and the installed SGLang, one sentence each."""
    found = []
    try:
        from importlib.metadata import version

        installed = version("sglang")
        if installed != PINNED:
            found.append(f"sglang {installed} is installed; the plugin is written for {PINNED}")
    except Exception as exc:  # noqa: BLE001 - any failure is the message
        found.append(f"sglang is not installed: {exc}")
        return found
    for spec in CALLABLES:
        obj = _resolve(spec.target, found)
        if obj is None:
            continue
        obj = inspect.unwrap(obj)  # a hook already applied must not hide the signature
        names = tuple(inspect.signature(obj).parameters)[: len(spec.params)]
        if names != spec.params:
            found.append(f"{spec.target} takes {names}, the plugin expects {spec.params}")
    for attr in ATTRS:
        cls = _resolve(attr.owner, found)
        if cls is not None and not _assigned_in_class(cls, attr.name):
            found.append(f"{attr.owner}.{attr.name} is no longer set by SGLang")
    for owner, member in ENUMS:
        _resolve(f"{owner}.{member}", found)
    return found


def _resolve(target: str, found: list[str]):
    """The object `target` names, or None with a sentence in `found` saying it is missing."""
    try:
        return pkgutil.resolve_name(target)
    except (ImportError, AttributeError) as exc:
        found.append(f"{target} is missing ({exc})")
        return None
