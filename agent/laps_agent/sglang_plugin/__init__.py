"""LAPS as a plugin to a stock SGLang (no fork): length-aware prefill scheduling on a prefill
server, and decode slots by first-token deadline on a decode server, decided by the same
`laps_agent.policy.scheduling` code as the builtin engine.

SGLang calls `register()` in each of its processes through the entry point group
`sglang.srt.plugins` (pyproject.toml), before its scheduler exists. Nothing here imports SGLang
at module level, so `laps_agent` stays importable (and testable) where SGLang is absent.

Modules: settings.py (env / config file), driver.py (policy <-> SGLang's waiting_queue, no
SGLang), hooks.py (the hooks), compat.py (what of SGLang is touched, checked at start),
metrics.py (the laps_engine_* series).
"""
from __future__ import annotations

import logging
import sys

from laps_agent.sglang_plugin.compat import (
    HOOK_BATCH_RESULT,
    HOOK_DECODE_ADMIT,
    HOOK_NEW_BATCH,
    HOOK_SEND_STAMPS,
    problems,
)
from laps_agent.sglang_plugin.settings import load_settings

log = logging.getLogger("laps.sglang_plugin")


def register() -> None:
    """Entry point: register the hooks when the scheduler is enabled; otherwise do nothing, so
    the server is vanilla SGLang."""
    try:
        settings = load_settings()
    except (OSError, ValueError) as exc:
        # A misconfigured plugin stops the server before it starts, as a bad `laps engine` flag
        # does: running on as vanilla SGLang (FIFO, no laps_engine_* series) behind a Ready pod
        # hid the typo. SystemExit, because SGLang's plugin loader logs and swallows Exceptions;
        # the launcher loads plugins before anything else, so nothing is left running.
        raise SystemExit(f"LAPS plugin: bad configuration: {exc}") from None
    if not settings.enabled:
        log.info("LAPS plugin installed but off (set LAPS_SCHEDULER=1 or LAPS_CONFIG_FILE)")
        return
    # lazy: SGLang, the hooks and the scheduling policy they drive load only where the plugin is on
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from laps_agent.sglang_plugin.hooks import make_hooks, send_arrival_stamps

    # The tokenizer (HTTP) side stamps each request's arrival but 0.5.23 does not send the stamps
    # to the scheduler; the plugin adds them (its waiting times count from arrival, see hooks.py).
    # Any process may serialise a request for the scheduler (the launcher loads plugins before
    # it imports its tokenizer); the target module is light. If it changed, SGLang logs that the
    # hook failed and the scheduler falls back to its own receive time (hooks.py).
    HookRegistry.register(HOOK_SEND_STAMPS, send_arrival_stamps, HookType.AFTER)
    # The scheduler hooks only where the scheduler runs: its process has imported the module
    # by the time it loads plugins; others skip the check rather than import it for nothing.
    if "sglang.srt.managers.scheduler" not in sys.modules:
        return
    found = problems()
    if found:
        log.error("LAPS plugin disabled: the installed SGLang does not match it: %s", "; ".join(found))
        return
    around, after, before_decode = make_hooks(settings)
    HookRegistry.register(HOOK_NEW_BATCH, around, HookType.AROUND)
    HookRegistry.register(HOOK_BATCH_RESULT, after, HookType.AFTER)
    HookRegistry.register(HOOK_DECODE_ADMIT, before_decode, HookType.BEFORE)
