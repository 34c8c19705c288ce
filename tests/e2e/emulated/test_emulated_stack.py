"""The gateway in front of emulated engines (`laps local --engine emulated`), through the official
`openai` client: answers, streaming, metrics, and batches that take the time their profile says."""
from __future__ import annotations

import time

import httpx
import openai
import pytest
import yaml

from laps_agent.emulated.profile import load_profile
from tests.support.emulated_profiles import synthetic_profile
from tests.support.metrics_text import metric_value as _metric

# Round numbers, so the expected batch time is plain arithmetic; graphs on, as on a GPU.
PROFILE = synthetic_profile(
    "test-gpu", served="emulated-test",
    prefill={"overhead_s": 0.040, "per_token_s": 0.0002, "graph": {"overhead_s": 0.020, "per_token_s": 0.0001}},
    decode={"overhead_s": 0.010, "per_request_s": 0.0001}, transfer={"latency_s": 0.002, "bytes_per_s": 1.0e9})



@pytest.fixture
def emulated_stack(laps_local, tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    # No waiting window: each sequential request is a batch of its own.
    return laps_local("--engine", "emulated", "--profile", str(path), "--prefill", "2", "--decode", "1",
                      "--wait-window-ms", "0", timeout=120), load_profile(path)


def test_openai_client_gets_answers_streams_and_metrics_move(emulated_stack):
    stack, profile = emulated_stack
    client = openai.OpenAI(base_url=stack.url, api_key="unused", timeout=60, max_retries=0)
    [model] = client.models.list().data
    assert model.id == "emulated-test"

    reply = client.chat.completions.create(model=model.id, max_tokens=7,
                                           messages=[{"role": "user", "content": "What is LAPS?"}])
    assert reply.choices[0].message.content.strip()
    assert reply.usage.completion_tokens == 7  # token counts are honoured

    chunks = list(client.completions.create(model=model.id, prompt="tell me a story", max_tokens=5,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text.strip() and chunks[-1].usage.completion_tokens == 5

    long_prompt = " ".join(["data"] * 600)  # past the 256-token threshold: the long group
    assert client.completions.create(model=model.id, prompt=long_prompt, max_tokens=2).choices[0].text
    client.close()

    gateway = httpx.get(stack.base + "/metrics").text
    assert _metric(gateway, "laps_gateway_requests_total", **{"class": "short", "group": "short"}) == 2
    assert _metric(gateway, "laps_gateway_requests_total", **{"class": "long", "group": "long"}) == 1
    status = httpx.get(stack.base + "/laps_status").json()
    engines = {g: status["groups"][g]["pods"][0]["url"] for g in ("short", "long")}
    for group, url in engines.items():
        info = httpx.get(url + "/get_server_info").json()
        assert (info["backend"], info["profile"], info["prefill_group"]) == ("emulated", "test-gpu", group)
        metrics = httpx.get(url + "/metrics").text
        assert _metric(metrics, "laps_engine_prefill_latency_seconds_count", **{"class": group}) >= 1
        assert _metric(metrics, "laps_engine_ttft_seconds_count", **{"class": group}) >= 1


def test_a_batch_takes_the_time_its_profile_gives(emulated_stack):
    stack, profile = emulated_stack
    short_engine = httpx.get(stack.base + "/laps_status").json()["groups"]["short"]["pods"][0]["url"]
    client = openai.OpenAI(base_url=stack.url, api_key="unused", timeout=60, max_retries=0)
    # Prompts that share no prefix: the engine's prefix cache would otherwise skip a page.
    for first_id, tokens, bucket in ((1000, 100, (1, 128)), (5000, 30, (1, 32))):
        before = _metric(httpx.get(short_engine + "/metrics").text,
                         "laps_engine_prefill_latency_seconds_sum", 0.0, **{"class": "short"})
        started = time.monotonic()
        stream = client.completions.create(model="emulated-test", prompt=list(range(first_id, first_id + tokens)),
                                           max_tokens=2, stream=True)
        first = next(iter(stream))
        ttft = time.monotonic() - started
        list(stream)
        after = _metric(httpx.get(short_engine + "/metrics").text,
                        "laps_engine_prefill_latency_seconds_sum", **{"class": "short"})
        # A short prompt runs as a CUDA graph of its bucket (this profile replays graphs)...
        expected = profile.prefill_seconds([tokens], bucket=bucket)
        assert after - before == pytest.approx(expected)
        # ...and the client waited at least that long, plus the KV hand-off, for its first token.
        assert first.choices[0].text and ttft >= expected + profile.transfer_seconds(tokens)
    client.close()


def test_prefix_cache_and_class_series_count_emulated_prefills(emulated_stack):
    """The dashboard's prefix-cache hit rate and class-agreement panels read the same series on
    emulated engines as on builtin ones (they were never fed: a hit rate of 0/0, always empty)."""
    stack, _ = emulated_stack
    status = httpx.get(stack.base + "/laps_status").json()
    prefill = [p["url"] for g in ("short", "long") for p in status["groups"][g]["pods"]]
    [decode] = [p["url"] for p in status["decode"]["pods"]]
    client = openai.OpenAI(base_url=stack.url, api_key="unused", timeout=60, max_retries=0)
    prompt = list(range(2000, 2100))   # 100 tokens: short; the second time its pages are cached
    for _ in range(2):
        assert client.completions.create(model="emulated-test", prompt=prompt, max_tokens=2).choices[0].text
    client.close()

    pages = [httpx.get(url + "/metrics").text for url in prefill]
    def total(name: str, **labels: str) -> float:   # a histogram child shows once observed
        return sum(_metric(page, name, 0, **labels) for page in pages)
    assert total("laps_engine_prefix_cache_lookup_tokens_total") == 2 * len(prompt)
    assert total("laps_engine_prefix_cache_hit_tokens_total") >= 96   # 6 whole 16-token pages
    assert total("laps_engine_prefix_cache_pages") >= 6
    assert total("laps_engine_class_total", gateway_class="short", engine_class="short") == 2
    # The first token is the prefill engine's: counted there, once, and not again at decode.
    assert total("laps_engine_ttft_seconds_count", **{"class": "short"}) == 2
    assert _metric(httpx.get(decode + "/metrics").text, "laps_engine_ttft_seconds_count", 0,
                   **{"class": "short"}) == 0


def test_two_requests_with_one_rid_at_once_are_both_answered_and_no_pod_is_blamed(emulated_stack):
    """SGLang's `rid` is often a client's job or idempotency id, and two workers may send one at
    the same time. Each engine must see it once: passed on as sent, one engine of each pair
    refused the copy it saw second, so each request broke on one side, and the one whose decode
    waited for KV got a 503 after the hand-off timeout and its prefill pod ejected."""
    from concurrent.futures import ThreadPoolExecutor

    stack, _ = emulated_stack
    body = {"text": "the same job", "rid": "job-1", "sampling_params": {"max_new_tokens": 48}}
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: httpx.post(stack.base + "/generate", json=body, timeout=20), range(4)))
    assert [r.status_code for r in replies] == [200] * 4, [r.text for r in replies]
    ids = [r.json()["meta_info"]["id"] for r in replies]
    assert all(i.startswith("job-1-") for i in ids) and len(set(ids)) == 4   # still the client's name
    status = httpx.get(stack.base + "/laps_status").json()
    assert all(pod["healthy"] for g in ("short", "long") for pod in status["groups"][g]["pods"])
