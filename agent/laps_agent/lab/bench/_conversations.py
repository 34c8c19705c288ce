"""Multi-turn conversations over HTTP for `laps bench run` (issue 12): each later turn re-sends
the conversation so far, with the answers the server actually gave.

Timing: closed loop per conversation, open loop across conversations. A conversation's first
turn is sent at its planned time whatever else is in flight (as every single request is); turn k
is sent only once turn k-1 has finished, when its user has read the answer and thought:

    send(k) = max(sent(k-1) + answer(k-1) / answer_tokens_per_s, done(k-1)) + think(k)

with think(k) the plan's own pause (plan gap minus the planned reading time). A server that keeps
up sends every turn at exactly its planned time; a slow one delays the rest of that conversation
(as it would delay a real user) instead of receiving a turn whose history it has not answered
yet, which could not be built anyway. A failed turn ends its conversation: there is no answer to
re-send, and the turns left unsent are counted in meta["turns_not_sent"].

Prompt sizes: the new user message is sized so the whole prompt has the plan's prompt_tokens in
the tokenizer, given the real history (earlier prompt, the real answer, chat-template tokens).
The plan's history_tokens assumed answers of exactly the planned length; with `ignore_eos` they
are, but their text re-tokenizes only approximately as the same count, so plan and wire differ
by a few tokens per turn (sent_prompt_tokens is the exact count sent). Without a tokenizer the
message has the plan's new_tokens words and the count is unknown.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laps_agent.lab.results import RequestRecord
from laps_agent.lab.results.turns import pod_load
from laps_agent.lab.workload import Plan, PromptBuilder
from laps_agent.lab.workload.conversations import oracle_cached_tokens

# KV page size of the builtin and emulated engines (--page-size / profile engine.page_size default):
# the oracle counts cached prefixes in whole pages, as the engines do.
DEFAULT_BLOCK_TOKENS = 16


@dataclass
class Transcript:
    """What a conversation has said so far: chat messages, or the completion prompt text."""
    messages: list[dict] = field(default_factory=list)
    prompt: str = ""


class TurnBuilder:
    """Request bodies of conversation turns (the caller adds model, max_tokens, stream...)."""

    def __init__(self, builder: PromptBuilder, tokenizer: Any, api: str):
        self.builder, self.tokenizer, self.api = builder, tokenizer, api

    def _count_chat(self, messages: list[dict]) -> int:
        return len(self.tokenizer.encode(self.tokenizer.apply_chat_template(messages)))

    def first(self, transcript: Transcript, value: Any) -> None:
        """Record turn 1's prompt (built by the runner, as for a single request)."""
        if self.api == "chat":
            transcript.messages = [dict(m) for m in value]
        else:
            transcript.prompt = value

    def later(self, transcript: Transcript, answer: str, target_tokens: int, new_tokens: int,
              index: int) -> tuple[Any, int | None]:
        """The prompt of a later turn: the transcript, the answer received, and a new user
        message sized so the prompt has `target_tokens` (at least one word). Updates
        `transcript` and returns (messages or prompt text, exact token count or None)."""
        words_of = lambda n: self.builder.build_text(n, index).value  # noqa: E731
        if self.api == "chat":
            history = transcript.messages + [{"role": "assistant", "content": answer}]
            if self.tokenizer is None:
                value, tokens = history + [{"role": "user", "content": words_of(max(1, new_tokens))}], None
            else:
                # One word measures the history and the new message's template tokens; filler
                # words are one token each (PromptBuilder), so n words add n - 1 more.
                base = self._count_chat(history + [{"role": "user", "content": words_of(1)}]) - 1
                value = history + [{"role": "user", "content": words_of(max(1, target_tokens - base))}]
                tokens = self._count_chat(value)
            transcript.messages = value
            return value, tokens
        history = transcript.prompt + answer
        if self.tokenizer is None:
            value, tokens = history + words_of(max(1, new_tokens)), None
        else:
            base = len(self.tokenizer.encode(history))
            value = history + words_of(max(1, target_tokens - base))
            tokens = len(self.tokenizer.encode(value))
        transcript.prompt = value
        return value, tokens


def _think_s(plan: Plan, prev: int, i: int) -> float:
    """The plan's pause between reading answer `prev` and sending turn `i` (>= 0)."""
    conv = plan.spec.phases[int(plan.phase[i])].conversation
    reading = float(plan.output_tokens[prev]) / conv.answer_tokens_per_s
    return max(0.0, float(plan.at[i] - plan.at[prev]) - reading)


async def converse(run: Any, turns: list[int]) -> None:
    """Send one conversation's turns in order (`run` is bench._runner._Run); see the module doc."""
    plan, api = run.plan, run.spec.api
    turn_builder = TurnBuilder(run.builder, run.tokenizer, api)
    transcript = Transcript()
    answer, ready = "", run.t0 + float(plan.at[turns[0]])
    for k, i in enumerate(turns):
        delay = ready - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if k == 0:
            body, sent_tokens = run._body(i)
            turn_builder.first(transcript, body["messages" if api == "chat" else "prompt"])
        else:
            body, _ = run._body(i, build=False)
            value, sent_tokens = turn_builder.later(transcript, answer, int(plan.prompt_tokens[i]),
                                                    int(plan.new_tokens[i]), i)
            body["messages" if api == "chat" else "prompt"] = value
        last = k == len(turns) - 1
        sent_at = time.perf_counter()
        out, record = await run._one(i, body, sent_tokens, collect_text=not last)
        if not record.ok:  # no answer to re-send (or the run was stopped): the conversation ends
            run.turns_not_sent += len(turns) - k - 1
            return
        if not last:
            answer = "".join(out.text or ())
            nxt = turns[k + 1]
            read_until = sent_at + float(plan.output_tokens[i]) / \
                plan.spec.phases[int(plan.phase[i])].conversation.answer_tokens_per_s
            ready = max(read_until, out.end_at or time.perf_counter()) + _think_s(plan, i, nxt)


class PodLoad:
    """Per prefill pod, the gateway's pending tokens summed over the /laps_status samples: the
    hot-spot figure of issue 12's targets (a pod's share of its group's queued prefill work)."""

    def __init__(self) -> None:
        self.pending: dict[str, float] = {}
        self.groups: dict[str, list[str]] = {}

    def add(self, status: dict) -> None:
        groups = {}
        for group, doc in (status.get("groups") or {}).items():
            if group == "decode" or not isinstance(doc, dict):
                continue
            names = []
            for pod in doc.get("pods") or ():
                name = pod.get("name") or pod.get("url")
                if name is None:
                    continue
                names.append(name)
                self.pending[name] = self.pending.get(name, 0.0) + float(pod.get("pending_tokens") or 0)
            groups[group] = names
        self.groups = groups  # the pods' groups at the last sample (pods move between groups)

    def ratios(self) -> dict[str, float]:
        return pod_load(self.pending, self.groups)


_BUSY_METRIC = "laps_engine_prefill_latency_seconds_sum"


async def prefill_busy(status_client: Any, client_factory: Any) -> tuple[dict[str, float], dict[str, list[str]]] | None:
    """Per prefill pod named in the gateway's /laps_status, the seconds its engine has spent in
    prefill batches (the sum of laps_engine_prefill_latency_seconds on its /metrics), and the pods
    by group: the busy time `laps sim` bases its hot-spot figure on. None when a pod does not
    export it (another engine): the caller falls back to the gateway's pending tokens."""
    import json

    out = await status_client.get("/laps_status", 5.0)
    try:
        groups = json.loads(out.body or b"")["groups"]
    except (ValueError, KeyError, TypeError):
        return None
    busy: dict[str, float] = {}
    members: dict[str, list[str]] = {}
    for group, doc in groups.items():
        if group == "decode" or not isinstance(doc, dict):
            continue
        members[group] = []
        for pod in doc.get("pods") or ():
            try:
                client = client_factory(pod["url"])
            except (KeyError, TypeError, ValueError):  # not a pod entry we can scrape
                return None
            try:
                text = (await client.get("/metrics", 5.0)).body or b""
            finally:
                client.close()
            lines = text.decode(errors="replace").splitlines()
            # A labelled histogram has no samples before its first batch, but its TYPE line
            # says the engine exports it (0 s busy so far).
            if f"# TYPE {_BUSY_METRIC.removesuffix('_sum')} histogram" not in lines:
                return None
            values = [float(line.rsplit(None, 1)[1]) for line in lines if line.startswith(_BUSY_METRIC)]
            busy[pod["name"]] = sum(values)  # over the class labels
            members[group].append(pod["name"])
    return busy, members


def busy_ratios(before: tuple | None, after: tuple | None) -> dict[str, float] | None:
    """Hot-spot figure from two prefill_busy() readings (pods in their groups at the end)."""
    if before is None or after is None:
        return None
    start, (end, groups) = before[0], after
    return pod_load({p: end[p] - start.get(p, 0.0) for p in end}, groups)


def shared_prefix_tokens(tokenizer: Any, api: str) -> int:
    """Tokens every chat prompt starts with (the template's role markers and default system
    prompt: 30 tokens of SmolLM2's), which any pod that served a chat request holds; 0 for
    completions or without a tokenizer."""
    if tokenizer is None or api != "chat":
        return 0
    a, b = (tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]))
            for text in (" alpha", " omega"))
    return next((n for n, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def prefix_meta(records: list[RequestRecord], plan: Plan, pods: PodLoad | None,
                block_tokens: int = DEFAULT_BLOCK_TOKENS, shared_tokens: int = 0,
                busy: dict[str, float] | None = None) -> dict:
    """meta["prefix"] for results/turns.py: the oracle's hit rate on what was really sent (each
    later turn's previous turn's sent prompt held in whole pages; every prompt's `shared_tokens`
    template prefix, which the oracle of workload/conversations.py leaves out as the simulator
    has no template), over the same requests and prompt tokens as the measured hit rate (those
    whose cached tokens the server reported)."""
    by_index = {r.index: r for r in records}
    cached = total = 0
    for r in records:
        if not (r.ok and r.cached_tokens is not None):
            continue
        total += r.prompt_tokens
        c = int(plan.conversation[r.index])
        turns = plan.turns_of(c) if c >= 0 else []
        pos = turns.index(r.index) if r.index in turns else 0
        prev = by_index.get(turns[pos - 1]) if pos > 0 else None
        sent = r.sent_prompt_tokens or r.prompt_tokens
        history = max(prev.sent_prompt_tokens or prev.prompt_tokens if prev is not None else 0, shared_tokens)
        cached += int(oracle_cached_tokens(np.array([sent]), np.array([history]), block_tokens)[0])
    meta = {"block_tokens": block_tokens, "oracle_hit_rate": cached / total if total else None,
            "pod_load": pods.ratios() if pods is not None else {},
            "pod_load_basis": "gateway pending tokens per prefill pod, summed over /laps_status samples"}
    if busy is not None:
        meta.update(pod_load=busy, pod_load_basis="prefill busy seconds per pod (engines' /metrics)")
    return meta
