"""The core of `laps bench run`, in-process: probe a target, replay a workload's plan against it
open loop, and collect the records (what `laps bench compare` calls once per system)."""
from __future__ import annotations

import asyncio
import datetime as _dt
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from laps_agent.lab.bench._client import StreamClient, StreamOutcome
from laps_agent.lab.bench._conversations import (
    PodLoad,
    busy_ratios,
    converse,
    prefill_busy,
    prefix_meta,
    shared_prefix_tokens,
)
from laps_agent.lab.results import RequestRecord, RunResult, TimelineSample
from laps_agent.lab.workload import Plan, PromptBuilder, WorkloadSpec, plan_requests
from laps_agent.lab.workload.plan import require_requests
from laps_agent.policy.classes import length_class

PROBE_TIMEOUT_S = 5.0
STATUS_INTERVAL_S = 1.0
LINES_EVERY_S = 5.0


class TargetError(RuntimeError):
    """The target does not answer (nothing listens, or it does not speak HTTP)."""


@dataclass(frozen=True)
class Target:
    url: str
    model: str
    has_status: bool                  # serves /laps_status (the laps gateway)
    api_key: str | None = field(default=None, repr=False)   # Bearer key for a gateway with auth


async def probe(url: str, *, model: str | None = None, timeout: float = PROBE_TIMEOUT_S,
                api_key: str | None = None) -> Target:
    """Check the target answers (GET /v1/models, which also names the model) and whether it
    has /laps_status. Raises TargetError within about `timeout` seconds."""
    client = StreamClient(url, connect_timeout=timeout, api_key=api_key)
    try:
        models = await client.get("/v1/models", timeout)
        if models.status == 0:
            raise TargetError(f"cannot reach {url}: {models.error}")
        if models.status == 401:
            raise TargetError(f"{url} wants an API key: give --api-key (or set OPENAI_API_KEY)"
                              if api_key is None else f"{url} refused the API key (401)")
        name = model
        if name is None:
            # No --model: the server must say what it serves (and so prove it speaks OpenAI).
            try:
                name = json.loads(models.body)["data"][0]["id"] if models.status == 200 else None
            except (ValueError, KeyError, IndexError, TypeError):
                name = None
            if name is None:
                raise TargetError(f"{url}: GET /v1/models answered {models.status} without a model "
                                  f"({models.error or 'no data[0].id'}); is this an OpenAI-compatible "
                                  "server? Give --model NAME if it has no /v1/models")
        status = await client.get("/laps_status", timeout)
        has_status = status.status == 200 and _json_groups(status.body) is not None
        return Target(url, name, has_status, api_key)
    finally:
        client.close()


def _json_groups(body: bytes | None) -> dict | None:
    try:
        doc = json.loads(body or b"")
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("groups"), dict) else None


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    pos = 0.9 * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _record(plan: Plan, i: int, cls: str, dispatched: float, t0: float, out: StreamOutcome,
            sent_tokens: int | None) -> RequestRecord:
    times = out.content_at
    gaps = [b - a for a, b in zip(times, times[1:])]
    return RequestRecord(
        index=i, phase=plan.phase_name(i), cls=cls, prompt_tokens=int(plan.prompt_tokens[i]),
        output_tokens=int(plan.output_tokens[i]), sent_s=dispatched - t0, status=out.status,
        error=out.error if out.error or out.status == 200 else f"HTTP {out.status}",
        ttft_s=times[0] - dispatched if times else None, e2e_s=(out.end_at or time.perf_counter()) - dispatched,
        tokens=len(times), itl_mean_s=sum(gaps) / len(gaps) if gaps else None,
        itl_p90_s=_p90(gaps) if gaps else None, itl_max_s=max(gaps) if gaps else None,
        server_prompt_tokens=out.prompt_tokens, sent_prompt_tokens=sent_tokens,
        turn=int(plan.turn[i]) if plan.conversation[i] >= 0 else None, cached_tokens=out.cached_tokens)


class _Run:
    def __init__(self, target: Target, spec: WorkloadSpec, plan: Plan, builder: PromptBuilder,
                 tokenizer: Any, threshold: int, timeout: float):
        self.target, self.spec, self.plan, self.builder = target, spec, plan, builder
        self.tokenizer, self.threshold, self.timeout = tokenizer, threshold, timeout
        self.client = StreamClient(target.url, api_key=target.api_key)
        self.path = "/v1/chat/completions" if spec.api == "chat" else "/v1/completions"
        self.records: list[RequestRecord] = []
        self.timeline: list[TimelineSample] = []
        self.sent = self.done = self.failed = 0
        self.t0 = 0.0
        self.tasks: set[asyncio.Task] = set()
        self.on_record: Callable[[RequestRecord], None] | None = None
        self.turns_not_sent = 0
        self.pods = PodLoad()

    def _body(self, i: int, build: bool = True) -> tuple[dict, int | None]:
        """The body of request i; without `build`, no prompt (a later conversation turn's)."""
        req = self.plan[i]
        # include_usage: the final usage chunk carries prompt and cached tokens.
        body: dict[str, Any] = {"model": self.target.model, "max_tokens": req.output_tokens, "stream": True,
                                "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 0}
        if not build:
            return body, None
        if req.source is not None:  # a JSONL line: its own text, counted at planning
            if self.spec.api == "chat":
                body["messages"] = req.source.chat_messages()
            else:
                body["prompt"] = req.source.completion_text(self.tokenizer)
            return body, req.prompt_tokens if self.tokenizer is not None else None
        built = self.builder.build(req.prompt_tokens, i, self.spec.api)
        body["messages" if self.spec.api == "chat" else "prompt"] = built.value
        return body, built.tokens

    async def _one(self, i: int, body: dict, sent_tokens: int | None,
                   collect_text: bool = False) -> tuple[StreamOutcome, RequestRecord]:
        self.sent += 1
        dispatched = time.perf_counter()
        out = StreamOutcome(text=[] if collect_text else None)
        try:
            await self.client.stream(self.path, body, self.timeout, out)
        except asyncio.CancelledError:  # the run was stopped: the request still counts, as cut
            out.error, out.end_at = out.error or "interrupted", out.end_at or time.perf_counter()
        cls = length_class(int(self.plan.prompt_tokens[i]), self.threshold)
        record = _record(self.plan, i, cls, dispatched, self.t0, out, sent_tokens)
        self.records.append(record)
        self.done += 1
        self.failed += not record.ok
        if self.on_record is not None:
            self.on_record(record)
        return out, record

    async def _poll_status(self) -> None:
        while True:
            out = await self.client.get("/laps_status", 2.0)
            doc = _json_groups(out.body) if out.status == 200 else None
            if doc is not None:
                self.timeline.append(TimelineSample.from_status(time.perf_counter() - self.t0, doc))
                self.pods.add(doc)
            await asyncio.sleep(STATUS_INTERVAL_S)

    async def dispatch(self) -> None:
        """Send every single request and every conversation's first turn at its planned time
        (open loop); a conversation's later turns follow its own answers (_conversations)."""
        at, conv, plan = self.plan.at, self.plan.conversation, self.plan
        for i in range(len(plan)):
            if conv[i] >= 0 and plan.turns_of(int(conv[i]))[0] != i:
                continue  # a later turn: sent by its conversation's task
            delay = self.t0 + at[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if conv[i] >= 0:
                task = asyncio.create_task(converse(self, plan.turns_of(int(conv[i]))))
            else:
                body, sent_tokens = self._body(i)
                task = asyncio.create_task(self._one(i, body, sent_tokens))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _dispatch_and_drain(self) -> None:
        await self.dispatch()
        while self.tasks:  # requests in flight, conversations with turns to come
            await asyncio.wait(set(self.tasks))

    async def run(self, stop: asyncio.Event | None) -> bool:
        """Dispatch, then wait for every answer; False when `stop` cut the run short."""
        finished = asyncio.create_task(self._dispatch_and_drain())
        waiters = [finished, *([asyncio.create_task(stop.wait())] if stop is not None else [])]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if finished.done():
                finished.result()  # re-raise what broke the dispatcher
                return True
            return False
        finally:
            pending = [*waiters, *self.tasks]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


def _progress_line(run: _Run, total: int) -> str:
    return (f"[laps bench] {time.perf_counter() - run.t0:6.1f}s  sent {run.sent}/{total}  done {run.done}  "
            f"failed {run.failed}  in flight {run.sent - run.done}")


async def _report_progress(run: _Run, mode: str) -> None:
    total = len(run.plan)
    if mode == "lines":
        while True:
            await asyncio.sleep(LINES_EVERY_S)
            print(_progress_line(run, total), flush=True)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("sent {task.fields[sent]}  failed {task.fields[failed]}"), TimeElapsedColumn())
    with Progress(*columns, refresh_per_second=4) as bar:
        task = bar.add_task("done", total=total, sent=0, failed=0)
        try:
            while True:
                bar.update(task, completed=run.done, sent=run.sent, failed=run.failed)
                await asyncio.sleep(0.25)
        finally:
            bar.update(task, completed=run.done, sent=run.sent, failed=run.failed)


async def run_workload(url: str, spec: WorkloadSpec, *, seed: int | None = None, rate_scale: float = 1.0,
                       max_requests: int | None = None, tokenizer: Any = None, tokenizer_name: str | None = None,
                       threshold: int | None = None, label: str | None = None, timeout: float = 300.0,
                       model: str | None = None, progress: str = "off", target: Target | None = None,
                       stop: asyncio.Event | None = None,
                       on_record: Callable[[RequestRecord], None] | None = None,
                       plan: Plan | None = None) -> RunResult:
    """Run `spec` against `url`; progress is "bar", "lines" (a line every 5 s) or "off".
    Raises TargetError when the target does not answer. Setting `stop` ends the run early:
    requests in flight are cut (error "interrupted") and meta["interrupted"] is true.
    `on_record` is called with every finished request (live displays, early stops). `plan`: one
    already made of `spec` with these rate_scale, max_requests and tokenizer (`laps bench compare`
    plans once for all its systems); by default it is made here, and a WorkloadError when it
    holds no request (nothing is sent)."""
    target = target or await probe(url, model=model)
    if seed is not None and seed != spec.seed:
        spec = spec.model_copy(update={"seed": seed})
    threshold = threshold or spec.threshold
    if plan is None:
        plan = require_requests(plan_requests(spec, rate_scale=rate_scale, max_requests=max_requests,
                                              tokenizer=tokenizer))
    builder = PromptBuilder(tokenizer, spec.seed)
    run = _Run(target, spec, plan, builder, tokenizer, threshold, timeout)
    run.on_record = on_record
    multi_turn = bool((plan.conversation >= 0).any())
    busy_before = await prefill_busy(run.client, StreamClient) if multi_turn and target.has_status else None
    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    run.t0 = time.perf_counter()
    helpers = [asyncio.create_task(run._poll_status())] if target.has_status else []
    if progress in ("bar", "lines"):
        helpers.append(asyncio.create_task(_report_progress(run, progress)))
    try:
        interrupted = not await run.run(stop)
    finally:
        for task in helpers:
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        busy_after = await prefill_busy(run.client, StreamClient) if busy_before is not None else None
        run.client.close()
    duration = time.perf_counter() - run.t0
    run.records.sort(key=lambda r: r.index)
    meta = {"label": label or spec.name, "tool": "laps bench run", "target": url, "model": target.model,
            "workload": {"name": spec.name, "spec": spec.to_dict(), "source": spec.origin},
            "seed": spec.seed, "rate_scale": rate_scale, "api": spec.api, "threshold": threshold,
            "started_at": started_at, "duration_s": duration, "planned_requests": len(plan),
            "sent_requests": run.sent, "interrupted": interrupted, "timeout_s": timeout,
            "phases": [w.to_dict() for w in plan.phases],
            "tokenizer": tokenizer_name, "prompt_mode": builder.mode,
            "prompt_note": ("prompt token counts are exact in the tokenizer" if builder.mode != "approximate"
                            else "no tokenizer: one filler word counted as one token (approximate)"),
            "chars_per_token": builder.chars_per_token, "laps_status": target.has_status}
    if multi_turn:
        meta.update(conversations="closed loop per conversation, open loop across conversations",
                    turns_not_sent=run.turns_not_sent,
                    prefix=prefix_meta(run.records, plan, run.pods if target.has_status else None,
                                       shared_tokens=shared_prefix_tokens(tokenizer, spec.api),
                                       busy=busy_ratios(busy_before, busy_after)))
    return RunResult(meta, run.records, run.timeline)


# ---------------------------------------------------------------- CLI
