"""Multi-turn conversations: a phase's arrivals start conversations of k turns.

Turn 1 sends a prompt of the phase's `prompt_tokens`; every answer has the phase's
`output_tokens`; turn k re-sends the whole conversation (turn k-1's prompt, its answer) plus a
new user message of `new_tokens`. So a later turn is long in full but mostly new to a prefill
pod only by the answer and the new message (in LMSYS-Chat-1M ~81% of later turns add fewer than
256 tokens); a prefill pod that served turn k-1 holds turn k-1's prompt (not the answer: the
decode pod produced that), which is `history_tokens`.

Timing is a recorded conversation's own clock, not the server's: turn k is sent when the user
has read answer k-1 at `answer_tokens_per_s` after sending turn k-1 and then thought for
min_think_s + Exp(think_s - min_think_s) seconds. The plan stays open-loop (the same arrays for
`laps bench`, `laps sim` and every system, so systems see the same requests); the think time
(seconds) dwarfs a TTFT, so the previous turn has been prefilled when the next one comes unless
the system is far past its capacity.

Draws come from their own streams (turns, new tokens, think times) seeded by (seed, phase), so
the same spec and seed give the same conversations.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from laps_agent.lab.workload.lengths import sample_lengths
from laps_agent.lab.workload.spec import Conversation


@dataclass(frozen=True)
class Turns:
    """One phase's requests, in conversation order (the plan sorts them by time)."""
    at: np.ndarray              # seconds from the phase start
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    new_tokens: np.ndarray      # tokens this turn adds as its user message (turn 1: its prompt)
    conversation: np.ndarray    # conversation id (first_id + index within the phase)
    turn: np.ndarray            # 1-based
    history_tokens: np.ndarray  # the previous turn's prompt: what its prefill pod holds (turn 1: 0)


def expand(conv: Conversation, starts: np.ndarray, first_prompts: np.ndarray, output_rng: np.random.Generator,
           turns_rng: np.random.Generator, new_rng: np.random.Generator, think_rng: np.random.Generator,
           output_dist, first_id: int) -> Turns:
    n = starts.size
    turns = sample_lengths(conv.turns, n, turns_rng) if n else np.empty(0, np.int64)
    total = int(turns.sum())
    outputs = sample_lengths(output_dist, total, output_rng) if total else np.empty(0, np.int64)
    news = sample_lengths(conv.new_tokens, total, new_rng) if total else np.empty(0, np.int64)
    extra = conv.think_s - conv.min_think_s
    thinks = conv.min_think_s + (think_rng.exponential(extra, total) if extra > 0 else np.zeros(total))
    cols: dict[str, list] = {k: [] for k in ("at", "prompt", "output", "new", "conv", "turn", "history")}
    j = 0  # index into the per-turn draws: a conversation cut short leaves its draws unused
    for c in range(n):
        t, prompt, history = float(starts[c]), int(first_prompts[c]), 0
        for k in range(1, int(turns[c]) + 1):
            new = prompt if k == 1 else int(news[j + k - 1])
            if k > 1:
                answer = int(outputs[j + k - 2])
                t += answer / conv.answer_tokens_per_s + float(thinks[j + k - 1])
                history, prompt = prompt, prompt + answer + new
                if prompt > conv.max_prompt_tokens:
                    break
            for key, value in (("at", t), ("prompt", prompt), ("output", int(outputs[j + k - 1])),
                               ("new", new), ("conv", first_id + c), ("turn", k), ("history", history)):
                cols[key].append(value)
        j += int(turns[c])
    ints = {k: np.asarray(v, dtype=np.int64) for k, v in cols.items() if k != "at"}
    return Turns(np.asarray(cols["at"], dtype=float), ints["prompt"], ints["output"], ints["new"],
                 ints["conv"], ints["turn"].astype(np.int32), ints["history"])


def oracle_cached_tokens(prompt_tokens: np.ndarray, history_tokens: np.ndarray, block_tokens: int) -> np.ndarray:
    """Per request, the prompt tokens an oracle router finds cached: every turn goes to the pod
    holding its conversation's longest prefix, caches never evict (unlimited capacity) and no
    load bound applies. That prefix is the previous turn's prompt (what its prefill pod
    computed), in whole KV pages, and at least one token is always computed. Single requests
    and first turns share nothing (the load generator's prompts share no prefix)."""
    held = (history_tokens // block_tokens) * block_tokens
    return np.minimum(held, np.maximum(prompt_tokens - 1, 0))
