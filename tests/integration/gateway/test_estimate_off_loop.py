"""With a tokenizer, the gateway counts a prompt's tokens on a worker thread: while one request's
prompt is being tokenized, the gateway goes on serving everything else."""
from __future__ import annotations

import threading

import httpx

from tests.support.waiting import poll


class HeldTokenizer:
    """Counts one token per character, once the test lets it (`release`); `entered` is set when a
    tokenization has begun."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def encode_unlocked(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.entered.set()
        self.release.wait(30)
        return list(range(len(text)))

    encode = encode_unlocked

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return "".join(m["content"] for m in messages)


def test_the_gateway_serves_on_while_a_prompt_is_tokenized(pd_stack):
    from laps_agent.gateway.estimate import TokenEstimator

    tokenizer = HeldTokenizer()
    gateway, engines = pd_stack(estimator=TokenEstimator(tokenizer))
    replies: list[httpx.Response] = []
    sender = threading.Thread(target=lambda: replies.append(httpx.post(
        f"{gateway.url}/v1/completions", json={"prompt": "x" * 100, "max_tokens": 2}, timeout=60)))
    sender.start()
    try:
        poll(tokenizer.entered.is_set, message="the tokenizer to be called")
        assert httpx.get(f"{gateway.url}/live", timeout=5).status_code == 200
        assert httpx.get(f"{gateway.url}/laps_status", timeout=5).status_code == 200
    finally:
        tokenizer.release.set()
        sender.join(60)
    assert replies[0].status_code == 200, replies[0].text
    assert len(engines["long"].requests) == 1  # 100 tokens, past the stack's 64-token threshold
