"""The request plan: a workload turned into the exact, deterministic sequence of requests.

Same spec and seed give the same plan in any process: every phase draws from its own numpy
PCG64 generators seeded with (seed, phase index, stream), one stream each for arrivals, prompt
lengths and output lengths, so changing one phase never shifts the draws of another.
The plan is stored as numpy arrays (a simulator plans millions of requests); `plan[i]` gives one
`PlannedRequest`.

`rate_scale` multiplies every phase's rate: a phase with `duration_s` keeps its duration (and
gets more or fewer requests), a phase with `requests` keeps its count (and gets shorter or
longer). A phase given by `requests` ends at its last arrival; the next one starts there.

A phase with `conversation` (conversations.py): its arrivals (and `requests`) start
conversations, whose later turns may come after the phase's end; the plan is in send order all
the same, and arrays `conversation` (-1: a single request), `turn` (1-based), `new_tokens` and
`history_tokens` say which turn of which conversation each request is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from laps_agent.lab.workload import arrivals
from laps_agent.lab.workload.conversations import expand
from laps_agent.lab.workload.jsonl import JsonlLine, JsonlSource, load_jsonl, pick
from laps_agent.lab.workload.lengths import sample_lengths
from laps_agent.lab.workload.spec import Jsonl, WorkloadError, WorkloadSpec

_ARRIVALS, _PROMPTS, _OUTPUTS, _LINES, _TURNS, _NEW, _THINK = range(7)


def _rng(seed: int, phase: int, stream: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, phase, stream])))


@dataclass(frozen=True)
class PhaseWindow:
    index: int
    name: str
    start_s: float
    end_s: float
    mean_rate: float                  # requests/s after rate_scale
    requests: int                     # planned requests in this phase

    def to_dict(self) -> dict:
        return {"name": self.name, "start_s": self.start_s, "end_s": self.end_s,
                "mean_rate": self.mean_rate, "requests": self.requests}


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    phase: int                        # index into plan.phases
    at: float                         # seconds from the run start
    prompt_tokens: int
    output_tokens: int
    source: JsonlLine | None = None   # the JSONL line of a jsonl phase
    conversation: int = -1            # -1: not part of a conversation
    turn: int = 1
    new_tokens: int = 0               # the user message this turn adds (turn 1: its prompt)
    history_tokens: int = 0           # the previous turn's prompt (0: none)


class Plan:
    """Arrays `at`, `prompt_tokens`, `output_tokens`, `phase` (and `line`: the JSONL line index,
    -1 for synthetic prompts), phase windows and the jsonl sources by phase index."""

    def __init__(self, spec: WorkloadSpec, at: np.ndarray, prompt_tokens: np.ndarray,
                 output_tokens: np.ndarray, phase: np.ndarray, line: np.ndarray,
                 phases: list[PhaseWindow], sources: dict[int, JsonlSource], rate_scale: float,
                 conversation: np.ndarray | None = None, turn: np.ndarray | None = None,
                 new_tokens: np.ndarray | None = None, history_tokens: np.ndarray | None = None):
        self.spec, self.at, self.prompt_tokens, self.output_tokens = spec, at, prompt_tokens, output_tokens
        self.phase, self.line, self.phases, self.sources = phase, line, phases, sources
        self.rate_scale = rate_scale
        n = at.size
        self.conversation = conversation if conversation is not None else np.full(n, -1, dtype=np.int64)
        self.turn = turn if turn is not None else np.ones(n, dtype=np.int32)
        self.new_tokens = new_tokens if new_tokens is not None else prompt_tokens
        self.history_tokens = history_tokens if history_tokens is not None else np.zeros(n, dtype=np.int64)
        self._turns_of: dict[int, list[int]] | None = None

    def __len__(self) -> int:
        return int(self.at.size)

    def __getitem__(self, i: int) -> PlannedRequest:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        phase = int(self.phase[i])
        line = int(self.line[i])
        source = self.sources[phase].lines[line] if line >= 0 else None
        return PlannedRequest(i, phase, float(self.at[i]), int(self.prompt_tokens[i]),
                              int(self.output_tokens[i]), source, int(self.conversation[i]),
                              int(self.turn[i]), int(self.new_tokens[i]), int(self.history_tokens[i]))

    def turns_of(self, conversation: int) -> list[int]:
        """Plan indices of a conversation's turns, first turn first."""
        if self._turns_of is None:
            self._turns_of = {}
            for i in np.flatnonzero(self.conversation >= 0):
                self._turns_of.setdefault(int(self.conversation[i]), []).append(int(i))
            for turns in self._turns_of.values():
                turns.sort(key=lambda i: int(self.turn[i]))
        return self._turns_of.get(conversation, [])

    def __iter__(self) -> Iterator[PlannedRequest]:
        return (self[i] for i in range(len(self)))

    @property
    def duration_s(self) -> float:
        return self.phases[-1].end_s if self.phases else 0.0

    def phase_name(self, i: int) -> str:
        return self.phases[int(self.phase[i])].name


# More requests than one plan holds in memory (about 100 bytes each here, and much more in a
# simulation): refused with the phase named instead of a MemoryError or the OOM killer.
MAX_PLANNED_REQUESTS = 20_000_000


def _check_size(spec: WorkloadSpec, p: int, expected: float, budget: int | None) -> None:
    if budget is None and expected > MAX_PLANNED_REQUESTS:
        raise WorkloadError(f"{spec.origin}: phases[{p}]: plans about {expected:.3g} requests, more than "
                            f"{MAX_PLANNED_REQUESTS:,} (lower its rate, duration_s or requests, or give "
                            "--max-requests)")


def plan_requests(spec: WorkloadSpec, *, rate_scale: float = 1.0, max_requests: int | None = None,
                  tokenizer: Any | None = None) -> Plan:
    """The requests of `spec`, in send order. `tokenizer` only matters for jsonl phases (their
    prompt lengths are token counts; without one, a heuristic estimate)."""
    if not rate_scale > 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    if max_requests is not None and max_requests < 0:
        raise ValueError(f"max_requests must be >= 0, got {max_requests}")
    budget = max_requests if max_requests is not None else None
    parts: list[tuple[np.ndarray, ...]] = []
    windows: list[PhaseWindow] = []
    sources: dict[int, JsonlSource] = {}
    loaded: dict[str, JsonlSource] = {}
    next_line: dict[str, int] = {}
    start = 0.0
    conversations = 0
    for p, phase in enumerate(spec.phases):
        if budget is not None and budget <= 0:
            break
        process = arrivals.scaled(phase.arrival, rate_scale)
        rng = _rng(spec.seed, p, _ARRIVALS)
        # Only the arrivals the budget keeps are drawn; not for conversations, whose first
        # `budget` requests in time may include turns of conversations that start later.
        limit = budget if phase.conversation is None else None
        if phase.duration_s is not None:
            _check_size(spec, p, process.mean_rate * phase.duration_s, limit)
            times = arrivals.until(process, phase.duration_s, rng, limit=limit)
            end = start + phase.duration_s
        else:
            _check_size(spec, p, phase.requests, limit)
            times = arrivals.count(process, phase.requests if limit is None else min(phase.requests, limit), rng)
            end = start + (float(times[-1]) if times.size else 0.0)
        if budget is not None and times.size > budget:
            times = times[:budget]
            end = start + float(times[-1]) if phase.duration_s is None else end
        n = times.size
        outputs = sample_lengths(phase.output_tokens, n, _rng(spec.seed, p, _OUTPUTS))
        line = np.full(n, -1, dtype=np.int64)
        if isinstance(phase.prompt_tokens, Jsonl):
            key = phase.prompt_tokens.path
            if key not in loaded:
                path = spec.base_dir / key
                loaded[key] = load_jsonl(path, spec.api, tokenizer, spec.origin)
            source = sources[p] = loaded[key]
            line = pick(source, phase.prompt_tokens.order, next_line.get(key, 0), n, _rng(spec.seed, p, _LINES))
            next_line[key] = next_line.get(key, 0) + n
            prompts = source.prompt_tokens[line]
            given = np.array([ln.output_tokens or 0 for ln in source.lines], dtype=np.int64)[line]
            outputs = np.where(given > 0, given, outputs)
        else:
            prompts = sample_lengths(phase.prompt_tokens, n, _rng(spec.seed, p, _PROMPTS))
        conv, turn, new, history = np.full(n, -1, dtype=np.int64), np.ones(n, np.int32), prompts, np.zeros(n, np.int64)
        if phase.conversation is not None:
            t = expand(phase.conversation, times, prompts, _rng(spec.seed, p, _OUTPUTS), _rng(spec.seed, p, _TURNS),
                       _rng(spec.seed, p, _NEW), _rng(spec.seed, p, _THINK), phase.output_tokens, conversations)
            conversations += n
            order = np.argsort(t.at, kind="stable")[:budget]
            times, prompts, outputs = t.at[order], t.prompt_tokens[order], t.output_tokens[order]
            new, conv, turn, history = t.new_tokens[order], t.conversation[order], t.turn[order], t.history_tokens[order]
            n, line = times.size, np.full(times.size, -1, dtype=np.int64)
        parts.append((start + times, prompts, outputs, np.full(n, p, dtype=np.int32), line, conv, turn, new, history))
        windows.append(PhaseWindow(p, phase.name, start, end, process.mean_rate, n))
        start = end
        if budget is not None:
            budget -= n
    if parts:
        cols = [np.concatenate(col) for col in zip(*parts)]
        if conversations:  # later turns may come after the next phase began: send order
            order = np.argsort(cols[0], kind="stable")
            cols = [c[order] for c in cols]
        at, prompts, outputs, phase_idx, lines, conv, turn, new, history = cols
    else:
        at, prompts, outputs = np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64)
        phase_idx, lines = np.empty(0, np.int32), np.empty(0, np.int64)
        conv, turn, new, history = None, None, None, None
    return Plan(spec, at, prompts, outputs, phase_idx, lines, windows, sources, rate_scale,
                conv, turn, new, history)


def _phase_said(w: PhaseWindow) -> str:
    return f"phases[{w.index}] {w.name!r}: {w.mean_rate:g} req/s for {w.end_s - w.start_s:g} s"


def require_requests(plan: Plan) -> Plan:
    """`plan` when each of its phases holds a request; else a WorkloadError naming the empty
    phases' rate and duration and what to change. A run of nothing measures nothing, yet wrote an
    empty result with exit 0; an empty phase among others ran as a silent pause, its row in every
    per-phase table blank. (Only phases given by duration_s can plan none: `requests` is >= 1.)"""
    empty = [w for w in plan.phases if w.requests == 0]
    if not empty:
        return plan
    how = "lengthen duration_s or raise the rate (arrival.rate, --rate-scale, --load), or give requests: N"
    if not len(plan):
        raise WorkloadError(f"{plan.spec.origin}: plans no request: {', '.join(map(_phase_said, empty))}; {how}")
    verb = "plans" if len(empty) == 1 else "plan"
    raise WorkloadError(f"{plan.spec.origin}: {', '.join(map(_phase_said, empty))} {verb} no request, unlike "
                        f"the other phases; {how}")


def warmup_spec(spec: WorkloadSpec, seconds: float) -> WorkloadSpec:
    """What `laps bench compare` and `laps sim` replay before a measured run: the workload's first
    phase for `seconds`, with another seed (connections, queues and the allocation loop settle on
    the same kind of load, without seeing the measured requests)."""
    first = spec.phases[0].model_copy(update={"duration_s": seconds, "requests": None, "name": "warm-up"})
    return spec.model_copy(update={"phases": [first], "seed": spec.seed + 1, "name": f"{spec.name}-warm-up"})


def warmup_plan(spec: WorkloadSpec, seconds: float, *, rate_scale: float = 1.0,
                tokenizer: Any | None = None) -> Plan | None:
    """The warm-up's plan (`warmup_spec`), None for none (`seconds` 0). A WorkloadError when it
    holds no request: the systems would be measured cold after a warm-up said to have run."""
    if seconds <= 0:
        return None
    plan = plan_requests(warmup_spec(spec, seconds), rate_scale=rate_scale, tokenizer=tokenizer)
    if len(plan):
        return plan
    first = plan.phases[0]
    raise WorkloadError(f"{spec.origin}: --warmup-s {seconds:g} plans no warm-up request (phases[0] "
                        f"{spec.phases[0].name!r} at {first.mean_rate:g} req/s): give a longer --warmup-s, "
                        "or --warmup-s 0 for no warm-up")
