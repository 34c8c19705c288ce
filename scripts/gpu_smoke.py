"""A user's first minutes with a running data plane, as one script: `python -m scripts.gpu_smoke
URL`. Made for `laps local --device cuda` on a `device` tool machine (scripts/gpu_local.sh), where
no test suite runs; prints what it saw and exits 1 if any check failed.

Checks: the model list; short and long completions at once (both length classes); a streamed
chat answer; a seeded sampled answer twice (the same text); a bad request (4xx with a message) beside good ones."""
from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx

FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("  ok    " if ok else "  FAIL  ") + what)
    if not ok:
        FAILED.append(what)


async def complete(client: httpx.AsyncClient, model: str, prompt: str, **params) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0.0, **params}
    return await client.post("/v1/completions", json=body)


async def main(url: str) -> int:
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=300) as client:
        models = (await client.get("/v1/models")).json()["data"]
        model = models[0]["id"]
        print(f"model {model}")
        shorts = [f"Question {i}: what does a prefill engine do with prompt number {i}?" for i in range(16)]
        longs = [" ".join(f"word{j % 97}" for j in range(600 + 300 * i)) for i in range(2)]  # < the context
        t0 = time.monotonic()
        answers = await asyncio.gather(*(complete(client, model, p) for p in shorts + longs))
        took = time.monotonic() - t0
        codes = [r.status_code for r in answers]
        check(all(c == 200 for c in codes), f"16 short + 2 long completions at once: {codes.count(200)} of 18 "
                                             f"answered 200 in {took:.2f} s")
        for r in answers:
            if r.status_code != 200:
                print(f"    {r.status_code} {r.text[:160]}")
        tokens = [r.json()["usage"] for r in answers if r.status_code == 200]
        check(all(u["completion_tokens"] >= 1 for u in tokens), "each answer has generated tokens")
        print(f"  prompt tokens of the long ones: {[u['prompt_tokens'] for u in tokens[-2:]]}")

        body = {"model": model, "messages": [{"role": "user", "content": "Stream me a few words."}],
                "max_tokens": 12, "stream": True}
        chunks, done = 0, False
        async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
            async for line in stream.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    json.loads(line[6:])
                    chunks += 1
        check(stream.status_code == 200 and done and chunks >= 2, f"streamed chat: {chunks} chunks, [DONE]={done}")

        seeded = [complete(client, model, "Tell me a story about GPUs.", temperature=0.9, seed=1234,
                           max_tokens=24) for _ in range(2)]
        bad = complete(client, model, "This one asks for a negative temperature.", temperature=-1.0)
        neighbours = [complete(client, model, p) for p in shorts[:4]]
        *seeded_answers, bad_answer = await asyncio.gather(*seeded, bad)
        neighbour_answers = await asyncio.gather(*neighbours)
        texts = [r.json()["choices"][0]["text"] for r in seeded_answers]
        check(all(r.status_code == 200 for r in seeded_answers) and texts[0] == texts[1],
              f"a seeded sampled answer, twice: the same text ({texts[0][:40]!r})")
        check(bad_answer.status_code in (400, 422), f"temperature -1: {bad_answer.status_code} "
                                             f"{bad_answer.text[:120]}")
        check(all(r.status_code == 200 for r in neighbour_answers), "its neighbours answered 200")
        greedy_alone = answers[0].json()["choices"][0]["text"]
        again = (await complete(client, model, shorts[0])).json()["choices"][0]["text"]
        print(f"  greedy answer in a batch of 18 vs alone: {'same' if again == greedy_alone else 'differs'} "
              f"(bf16 kernels may differ between batch shapes)")
    print("all checks passed" if not FAILED else f"{len(FAILED)} check(s) failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000")))
