"""Multi-turn conversations over HTTP in `laps bench run` (issue 12): later turns re-send the
answers the server really gave, a turn waits for the previous one of its conversation, and the
server's cached_tokens land in the records.

Two real loopback servers: a small recording server (it answers every request with text of its
own and a cached-token figure of its own, and keeps what it received and when, so the test
compares what the client sent and recorded with what the server did), and `laps local` with
emulated engines, whose prefix cache reports cached tokens through the gateway and PD."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from laps_agent.lab.results import load_result
from laps_agent.lab.workload import PromptBuilder, parse_workload, plan_requests


def _spec(api: str, conversations: int = 3, turns: int = 3) -> dict:
    # think time far below the server's answer time: a sender that ignored the previous turn's
    # end would send the next turn while that one is still streaming
    return {"name": f"mt-{api}", "api": api, "seed": 7, "threshold": 256, "phases": [{
        "name": "chat", "requests": conversations, "arrival": {"process": "poisson", "rate": 20},
        "prompt_tokens": {"distribution": "fixed", "value": 30},
        "output_tokens": {"distribution": "fixed", "value": 6},
        "conversation": {"turns": {"distribution": "fixed", "value": turns},
                         "new_tokens": {"distribution": "fixed", "value": 8},
                         "think_s": 0.02, "min_think_s": 0.01, "answer_tokens_per_s": 10000}}]}


class RecordingServer:
    """OpenAI-shaped streaming answers over keep-alive HTTP/1.1; each answer's text and its
    usage.prompt_tokens_details.cached_tokens are unique to the request. `log`: one dict per
    generation request (body, answer, cached, received and finished on time.monotonic)."""

    TOKEN_DELAY_S = 0.02

    def __init__(self) -> None:
        self.log: list[dict] = []
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                line, *fields = head.split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
                raw = await reader.readexactly(int(headers.get("content-length", 0)))
                method, path = line.split()[:2]
                if method == "GET":
                    await self._json(writer, 200 if path == "/v1/models" else 404,
                                     {"data": [{"id": "recorder"}]} if path == "/v1/models" else {})
                else:
                    await self._generate(writer, path, json.loads(raw))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def _json(self, writer, status: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                     % (status, len(body), body))
        await writer.drain()

    async def _generate(self, writer, path: str, body: dict) -> None:
        entry = {"body": body, "received": time.monotonic(), "cached": 1000 + len(self.log)}
        self.log.append(entry)
        seq = len(self.log)
        pieces = [f" r{seq}w{j}" for j in range(body["max_tokens"])]
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        chat = path.endswith("/chat/completions")
        for piece in pieces:
            await asyncio.sleep(self.TOKEN_DELAY_S)
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            self._event(writer, {"choices": [choice]})
            await writer.drain()
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event(writer, {"choices": [], "usage": {
                "prompt_tokens": 1, "completion_tokens": len(pieces),
                "prompt_tokens_details": {"cached_tokens": entry["cached"]}}})
        data = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        entry["answer"] = "".join(pieces)
        entry["finished"] = time.monotonic()
        await writer.drain()

    @staticmethod
    def _event(writer, doc: dict) -> None:
        data = b"data: " + json.dumps(doc).encode() + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))


def _first_prompt(plan, i: int, api: str):
    """Turn 1's prompt as the runner builds it (no tokenizer: approximate mode)."""
    return PromptBuilder(None, plan.spec.seed).build(int(plan.prompt_tokens[i]), i, api).value


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_later_turns_resend_the_real_answers_after_the_previous_turn_ended(api):
    from laps_agent.lab.bench._runner import run_workload

    spec = parse_workload(_spec(api))
    plan = plan_requests(spec)
    server = RecordingServer()
    url = await server.start()
    try:
        result = await run_workload(url, spec, tokenizer=None, timeout=30)
    finally:
        await server.close()
    records = {r.index: r for r in result.records}
    assert len(server.log) == len(records) == len(plan) == 9 and result.meta["turns_not_sent"] == 0
    conversations = sorted({int(c) for c in plan.conversation})
    assert len(conversations) == 3
    for c in conversations:
        turns = plan.turns_of(c)
        first = _first_prompt(plan, turns[0], api)
        # the server's requests of this conversation, in the order it received them
        if api == "chat":
            mine = [e for e in server.log if e["body"]["messages"][0] == first[0]]
        else:
            mine = [e for e in server.log if e["body"]["prompt"].startswith(first)]
        assert len(mine) == len(turns) == 3
        for k in range(1, len(turns)):
            prev, entry = mine[k - 1], mine[k]
            if api == "chat":
                sent = entry["body"]["messages"]
                # earlier user turns, the answers the server gave, then one new user message
                assert sent[:-2] == prev["body"]["messages"]
                assert sent[-2] == {"role": "assistant", "content": prev["answer"]}
                assert sent[-1]["role"] == "user" and sent[-1]["content"] not in prev["body"]["messages"][-1]["content"]
                assert [m["role"] for m in sent] == ["user", "assistant"] * k + ["user"]
            else:
                assert entry["body"]["prompt"].startswith(prev["body"]["prompt"] + prev["answer"])
                assert len(entry["body"]["prompt"]) > len(prev["body"]["prompt"] + prev["answer"])
            # closed loop: sent only once the previous turn's answer had ended
            assert entry["received"] >= prev["finished"]
        for k, i in enumerate(turns):
            # what the server said it had cached for that request, and the turn, in the record
            assert records[i].turn == k + 1
            assert records[i].cached_tokens == mine[k]["cached"]
            assert records[i].ok and records[i].tokens == 6


async def test_a_failed_turn_ends_its_conversation():
    from laps_agent.lab.bench._runner import run_workload

    spec = parse_workload(_spec("chat", conversations=2))
    server = RecordingServer()
    url = await server.start()
    original = server._generate

    async def refuse_second_turns(writer, path, body):
        if len(body["messages"]) > 1:  # a later turn: answer 500, as a broken engine would
            server.log.append({"body": body})
            return await server._json(writer, 500, {"error": {"message": "broken"}})
        return await original(writer, path, body)

    server._generate = refuse_second_turns
    try:
        result = await run_workload(url, spec, tokenizer=None, timeout=30)
    finally:
        await server.close()
    assert [r.turn for r in result.records if r.ok] == [1, 1]
    assert sorted(r.turn for r in result.records if not r.ok) == [2, 2]
    assert len(server.log) == len(result.records) == 4     # no third turn was sent
    assert result.meta["turns_not_sent"] == 2 and result.meta["sent_requests"] == 4


WORKLOAD = """\
name: mt-emulated
seed: 4
api: chat
threshold: 256
phases:
  - name: chat
    requests: 3
    arrival: {process: poisson, rate: 5}
    prompt_tokens: {distribution: fixed, value: 70}
    output_tokens: {distribution: fixed, value: 10}
    conversation:
      turns: {distribution: fixed, value: 3}
      new_tokens: {distribution: fixed, value: 20}
      think_s: 0.1
      min_think_s: 0.05
      answer_tokens_per_s: 1000
"""


def test_bench_run_on_emulated_engines_records_cached_tokens_and_prints_turns(laps_local, tmp_path):
    stack = laps_local("--engine", "emulated", "--prefill", "2", "--decode", "1", timeout=180)
    workload = tmp_path / "mt.yaml"
    workload.write_text(WORKLOAD)
    out = tmp_path / "r"
    done = subprocess.run([sys.executable, "-m", "laps_agent.cli", "bench", "run", stack.base, "--workload",
                           str(workload), "--out", str(out), "--no-progress", "--timeout", "60"],
                          capture_output=True, text=True, timeout=180, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "## multi-turn: prefix hit rate and TTFT by turn" in done.stdout
    assert "| TTFT p90, turn 3 |" in done.stdout
    result = load_result(out)
    records = {r.index: r for r in result.records}
    assert len(records) == 9 and all(r.ok for r in records.values()), [r.error for r in records.values()]
    plan = plan_requests(parse_workload(__import__("yaml").safe_load(WORKLOAD)))
    page = result.meta["prefix"]["block_tokens"]
    for c in sorted({int(c) for c in plan.conversation}):
        turns = [records[i] for i in plan.turns_of(c)]
        assert [r.turn for r in turns] == [1, 2, 3]
        for prev, r in zip(turns, turns[1:]):
            # exact prompt sizes in the served tokenizer, as planned (answers of planned length)
            assert r.sent_prompt_tokens == r.server_prompt_tokens == r.prompt_tokens
            # the pod that prefilled the previous turn holds its prompt, in whole pages; the
            # gateway's affinity sent this turn there
            assert r.cached_tokens == (prev.sent_prompt_tokens // page) * page
    assert result.meta["prefix"]["oracle_hit_rate"] > 0
    # hot spots from the engines' own prefill busy time, as `laps sim` measures them
    assert result.meta["prefix"]["pod_load_basis"].startswith("prefill busy seconds")


def test_compare_prints_the_turn_table_and_the_targets_side_by_side(tmp_path):
    workload = tmp_path / "mt.yaml"
    workload.write_text(WORKLOAD)
    out = tmp_path / "cmp"
    done = subprocess.run([sys.executable, "-m", "laps_agent.cli", "bench", "compare", "--workload", str(workload),
                           "--engine", "emulated", "--prefill", "2", "--decode", "1", "--warmup-s", "0",
                           "--systems", "laps-noaffinity,laps", "--out", str(out), "--timeout", "60"],
                          capture_output=True, text=True, timeout=420, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for text in (done.stdout, (out / "compare.md").read_text()):
        assert "## multi-turn: prefix hit rate and TTFT by turn" in text
        assert "| | laps-noaffinity | laps |" in text
        assert "## targets (issue 12): laps vs laps-noaffinity" in text
    for system in ("laps-noaffinity", "laps"):
        result = load_result(out / system)
        assert len(result.records) == 9 and all(r.ok for r in result.records)
        assert sorted(r.turn for r in result.records) == [1] * 3 + [2] * 3 + [3] * 3
