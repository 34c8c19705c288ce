"""The burst the scheduling tests send, and how to read what the prefill server did with it.

Prompts are distinct random words (no shared prefix, so SGLang's radix cache cannot make a long
prompt short) of chosen lengths; every request has a distinct prompt length, which is how the
batch logs (the plugin's JSON lines, SGLang's own "Prefill batch" lines) name it.
"""
from __future__ import annotations

import json
import random
import re
import threading
import time
import uuid
from pathlib import Path

import httpx

_WORDS = ("amber basil cedar delta ember fjord grove harbor island jasper kettle lumen meadow "
          "nectar orchid pepper quartz raven saffron tundra umber velvet willow xenon yarrow zephyr").split()


def prompt(words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(words))


class Sender:
    """Sends completions to the gateway on threads; records when each answer came back."""

    def __init__(self, url: str) -> None:
        self.url, self.done, self.errors, self._threads = url, {}, [], []
        # One client for every thread: a client of its own per request costs each send its SSL
        # context (35 ms on an idle core here, more while SGLang computes), which stretched the
        # gaps the window test sends (then 60 ms) to 210 ms.
        self._client = httpx.Client(timeout=300)
        self.rids: dict[str, str] = {}  # name -> SGLang request id (what the batch logs show)

    def send(self, name: str, text: str) -> None:
        # SGLang's OpenAI endpoints take a request id (`rid`); the gateway passes it on made
        # unique (`<rid>-<hex>`), so the prefill server's batch log names the request.
        rid = self.rids[name] = f"{name}-{uuid.uuid4().hex[:8]}"

        def run() -> None:
            try:
                r = self._client.post(f"{self.url}/v1/completions",
                                      json={"model": "smollm2", "prompt": text, "max_tokens": 1,
                                            "temperature": 0, "rid": rid})
                r.raise_for_status()
                self.done[name] = (time.monotonic(), r.json()["usage"]["prompt_tokens"])
            except Exception as exc:  # noqa: BLE001 - reported by join()
                self.errors.append(f"{name}: {exc!r}")

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._threads.append(thread)

    def join(self, timeout: float = 300) -> dict:
        for thread in self._threads:
            thread.join(timeout)
        self._client.close()
        assert not self.errors, self.errors
        return self.done


def plugin_batches(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


_SGLANG_BATCH = re.compile(r"Prefill batch[^#]*#new-seq: (\d+), #new-token: (\d+)")


def sglang_batches(log_text: str) -> list[tuple[int, int]]:
    """(requests, new tokens) of each prefill batch, from SGLang's own log, in order."""
    return [(int(a), int(b)) for a, b in _SGLANG_BATCH.findall(log_text)]


# Scenario "short first", the same with the plugin on and off: a long request L1 runs; then a
# long request L2 and, GAP_S later, four short ones arrive. The gap is the scenario's arrival
# order (L2 reaches the server's queue first), not a synchronisation: every assertion is on
# the order the server chose, read from its batch logs.
L1_WORDS, L2_WORDS, SHORT_WORDS, GAP_S = 300, 520, (15, 19, 23, 27), 0.3


def send_short_first_burst(sender: Sender) -> None:
    import time

    sender.send("L2", prompt(L2_WORDS, seed=2))
    time.sleep(GAP_S)  # the scenario's arrival order (see above)
    for i, words in enumerate(SHORT_WORDS):
        sender.send(f"S{i}", prompt(words, seed=10 + i))
