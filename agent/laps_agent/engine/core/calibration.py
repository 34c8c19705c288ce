"""A prefill engine's speed, measured at start-up: a few synthetic prefills timed before the server
listens, fed to the scheduler's cost model (scheduling/window.PrefillCostModel).

Why: a prefill engine reports in /get_load what it can prefill within half its KV hand-off
timeout (load_report.py), from that model, and the gateway admits by it (gateway/admission.py).
Measured from real batches alone, a fresh engine (a new pod, `laps local` just started) had no
figure until its first batch, so its first burst was bounded by the token setting alone: on a CPU
the back of a burst of long chats waited out the hand-off timeout and failed with 503 where an
immediate 429 was due. The waiting window has the estimate from the first request on, too.

The first prefill is not timed: lazy kernel set-up and allocator growth would count as the
engine's speed. Prefills run eager (no bucket, no graph), on pages taken and given back: nothing
enters the prefix cache. Where real batches run faster (CUDA graphs, a warm allocator) the figure
starts low, the safe side: a few more 429s until real batches correct it. A decode engine
prefills nothing and is not calibrated. Measuring is an estimate's input, not serving: an engine
whose calibration fails (a device error) starts without the figure, as before it existed."""
from __future__ import annotations

import logging
import time

from laps_agent.engine.core.engine_core import EngineCore
from laps_agent.engine.core.forward import ForwardItem
from laps_agent.policy.scheduling.window import calibration_lengths

log = logging.getLogger("laps.engine")


def calibrate_prefill(core: EngineCore) -> list[tuple[int, float]]:
    """Time a prefill of each calibration length on `core`'s runner and feed the scheduler's cost
    model; returns the (tokens, seconds) samples: none on a decode engine, or when a prefill
    failed (logged). Call it before the engine thread starts."""
    if core.config.role == "decode":
        return []
    lengths = calibration_lengths(core.max_prompt_tokens(), core.config.scheduler.max_prefill_tokens)
    samples = []
    try:
        for i, tokens in enumerate([lengths[0], *lengths]):
            seconds = _timed_prefill(core, f"calibration-{i}", tokens)
            if i:
                samples.append((tokens, seconds))
    except Exception as exc:  # noqa: BLE001 - serving does not depend on it (module docstring)
        log.warning("prefill speed not measured at start-up (%s: %s): the gateway bounds this "
                    "engine by its token setting until its first prefill batch", type(exc).__name__, exc)
        return []
    core.scheduler.calibrate(samples)
    return samples


def _timed_prefill(core: EngineCore, rid: str, tokens: int) -> float:
    vocab = core.runner.config.vocab_size
    ids = [1 + i % (vocab - 1) for i in range(tokens)]   # any ids: the cost does not depend on them
    core.kv.allocate(rid, tokens)   # without the prompt: nothing shared or cached
    try:
        started = time.monotonic()
        logits, _ = core.runner.forward([ForwardItem(token_ids=ids, start_pos=0, pages=core.kv.pages(rid))])
        logits.argmax(dim=-1).tolist()   # waits for the device, as sampling a batch does
        return time.monotonic() - started
    finally:
        core.kv.free(rid)
