"""The plugin's configuration: environment variables and/or a YAML file, no SGLang flags.

SGLang's launcher rejects unknown flags, so the LAPS knobs cannot ride on its command line
without a fork. They come instead from (later wins):

1. `LAPS_CONFIG_FILE`: a YAML file shaped like a LAPSCluster's `spec.laps` (the CRD's names):
   `lengthThreshold`, `scheduler: {enabled, waitWindowMs, waitMaxBatch, adaptiveWindow,
   maxLongWaitMs, maxLongBatchTokens, longInWindow}`;
2. one environment variable per builtin-engine flag (`laps engine --length-threshold` ->
   `LAPS_LENGTH_THRESHOLD`, `--laps-scheduler` -> `LAPS_SCHEDULER`, `--slo` -> `LAPS_SLO`, ...),
   the form the operator renders into the pod.

Without `LAPS_SCHEDULER` or a file saying `scheduler.enabled: true` the plugin stays out of
SGLang's way entirely (installing it into an image must not change a vanilla server).
A bad value, a value of the wrong type in the file, or a `LAPS_*` name one typo away from a
setting is a ValueError naming it (the server then refuses to start: `register`), never a
silent default. Pure Python: imported and tested without SGLang.
"""
from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from laps_agent.policy.scheduling.config import LONG_IN_WINDOW_RULES, SchedulerConfig
from laps_agent.policy.scheduling.decode_order import DECODE_ORDERS, DecodeOrder, chosen_order
from laps_agent.policy.slo import ttft_slos
from laps_agent.serving.flag_types import slo_seconds

CONFIG_FILE_ENV = "LAPS_CONFIG_FILE"
# env var -> (SchedulerConfig field, parser); names mirror `laps engine`'s flags.
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"not a boolean: {text!r}")


ENV_KNOBS: dict[str, tuple[str, type | object]] = {
    "LAPS_SCHEDULER": ("enabled", _bool),
    "LAPS_LENGTH_THRESHOLD": ("length_threshold", int),
    "LAPS_WAIT_WINDOW_MS": ("wait_window_ms", float),
    "LAPS_WAIT_MAX_BATCH": ("wait_max_batch", int),
    "LAPS_ADAPTIVE_WINDOW": ("adaptive_window", _bool),
    "LAPS_MAX_LONG_WAIT_MS": ("max_long_wait_ms", float),
    "LAPS_MAX_LONG_BATCH_TOKENS": ("max_long_batch_tokens", int),
    "LAPS_LONG_IN_WINDOW": ("long_in_window", str),
    # SGLang's own budgets still apply inside a batch; these cap what LAPS hands it.
    "LAPS_MAX_BATCH_SIZE": ("max_batch_size", int),
    "LAPS_MAX_PREFILL_TOKENS": ("max_prefill_tokens", int),
}
# The plugin's other variables (hooks.py, metrics.py): together with ENV_KNOBS every LAPS_* name
# it reads, so a near miss of one of them is reported as the typo it is.
OTHER_ENV = (CONFIG_FILE_ENV, "LAPS_LABELS_FILE", "LAPS_BATCH_LOG", "LAPS_METRICS_PORT", "LAPS_SLO",
             "LAPS_DECODE_ORDER")
# CRD camelCase (spec.laps.scheduler.*) -> (SchedulerConfig field, the YAML type the CRD gives it)
_FILE_SCHEDULER_KEYS = {
    "enabled": ("enabled", bool), "waitWindowMs": ("wait_window_ms", float),
    "waitMaxBatch": ("wait_max_batch", int), "adaptiveWindow": ("adaptive_window", bool),
    "maxLongWaitMs": ("max_long_wait_ms", float), "longInWindow": ("long_in_window", str),
    "maxLongBatchTokens": ("max_long_batch_tokens", int),
}


def _typed(where: str, value: object, kind: type) -> object:
    """`value` from the YAML file if it has the CRD's type (an int is a number; a bool is not)."""
    ok = (isinstance(value, bool) if kind is bool else
          isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else
          isinstance(value, int) and not isinstance(value, bool) if kind is int else
          isinstance(value, kind))
    if not ok:
        expected = {bool: "true or false", float: "a number", int: "an integer"}.get(kind, "a string")
        raise ValueError(f"{where} must be {expected}, got {value!r}")
    return value


@dataclass(frozen=True)
class PluginSettings:
    scheduler: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(enabled=False))
    labels_file: str | None = None      # downward-API labels (the pod's prefill group)
    sources: tuple[str, ...] = ()       # where the values came from, for the start-up log
    # A decode server's: LAPS_SLO (`laps engine --slo`), LAPS_DECODE_ORDER (`--decode-order`).
    ttft_slo_s: Mapping[str, float] = field(default_factory=ttft_slos)
    decode_order_rule: str = DECODE_ORDERS[0]

    @property
    def enabled(self) -> bool:
        return self.scheduler.enabled

    @property
    def decode_order(self) -> DecodeOrder | None:
        """The order a decode server's requests whose KV arrived take free slots (None: SGLang's
        own, arrival order), as `laps engine`'s decode_order(args)."""
        return chosen_order(self.enabled, self.decode_order_rule, self.ttft_slo_s, self.scheduler.length_threshold)


def _from_file(path: Path) -> dict:
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a mapping like spec.laps, got {type(data).__name__}")
    # spec.laps's other keys are accepted and not the plugin's: SGLang's own flags
    # (prefixCache: --disable-radix-cache), the gateway's (prefixAffinity), the operator's.
    unknown = set(data) - {"lengthThreshold", "prefixCache", "prefixAffinity", "prefixWarm",
                           "scheduler", "batchPrefillGraphs", "allocation"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
    values: dict = {}
    if "lengthThreshold" in data:
        values["length_threshold"] = _typed(f"{path}: lengthThreshold", data["lengthThreshold"], int)
    sched = data.get("scheduler") or {}
    if not isinstance(sched, Mapping):
        raise ValueError(f"{path}: scheduler must be a mapping, got {sched!r}")
    bad = set(sched) - set(_FILE_SCHEDULER_KEYS)
    if bad:
        raise ValueError(f"{path}: unknown scheduler keys {sorted(bad)}")
    for key, (name, kind) in _FILE_SCHEDULER_KEYS.items():
        if key in sched:
            values[name] = _typed(f"{path}: scheduler.{key}", sched[key], kind)
    # A file that configures the scheduler means "on" unless it says otherwise (as in the CRD).
    values.setdefault("enabled", True)
    return values


def load_settings(environ: Mapping[str, str] | None = None) -> PluginSettings:
    """Settings from `environ` (default os.environ); ValueError names the bad variable/key."""
    env = os.environ if environ is None else environ
    known = (*ENV_KNOBS, *OTHER_ENV)
    for var in env:
        near = difflib.get_close_matches(var, known, n=1, cutoff=0.8) if var.startswith("LAPS_") else []
        if near and var not in known:
            raise ValueError(f"{var} is not a LAPS plugin setting; did you mean {near[0]}?")
    port = env.get("LAPS_METRICS_PORT")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"LAPS_METRICS_PORT={port!r}: not a TCP port")
    values: dict = {"enabled": False}
    sources = []
    file = env.get(CONFIG_FILE_ENV)
    if file:
        values.update(_from_file(Path(file)))
        sources.append(file)
    for var, (name, parse) in ENV_KNOBS.items():
        if var in env:
            try:
                values[name] = parse(env[var])  # type: ignore[operator]
            except ValueError as exc:
                raise ValueError(f"{var}={env[var]!r}: {exc}") from None
            sources.append(var)
    slo = ttft_slos()
    if "LAPS_SLO" in env:
        try:
            slo = ttft_slos(slo_seconds(env["LAPS_SLO"]))
        except argparse.ArgumentTypeError as exc:
            raise ValueError(f"LAPS_SLO={env['LAPS_SLO']!r}: {exc}") from None
        sources.append("LAPS_SLO")
    rule = env.get("LAPS_DECODE_ORDER", DECODE_ORDERS[0])
    if rule not in DECODE_ORDERS:
        raise ValueError(f"LAPS_DECODE_ORDER={rule!r}: must be one of {DECODE_ORDERS}")
    if values.get("long_in_window", "cost") not in LONG_IN_WINDOW_RULES:
        raise ValueError(f"LAPS_LONG_IN_WINDOW must be one of {LONG_IN_WINDOW_RULES}")
    try:
        scheduler = SchedulerConfig(**values)
    except ValueError as exc:  # an out-of-range value: name where it came from
        raise ValueError(f"{exc} (from {', '.join(sources) or 'defaults'})") from None
    return PluginSettings(scheduler=scheduler, labels_file=env.get("LAPS_LABELS_FILE") or None,
                          sources=tuple(sources), ttft_slo_s=slo, decode_order_rule=rule)
