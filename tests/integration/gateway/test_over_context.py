"""A prompt longer than the engines' context, sent while its group is overloaded (emulated
engines, the real PD protocol): the client gets the engines' own 400 `context_length_exceeded`,
word for word, not a 429. OpenAI's SDK resends a 429 on its own; a prompt that can never fit
must fail once, at once."""
from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.emulated_profiles import synthetic_profile
from tests.support.fixtures_gateway import RawRequest, poll
from tests.support.metrics_text import metric_value
from tests.support.refusals import admission_refusal

CONTEXT = 512             # the engines take prompts of at most 511 tokens
BOUND = 100               # pending tokens per pod: one held 300-token prompt overloads the long group
# Prefill costs 0.1 s per token: the held 300-token prompt stays pending for the whole test.
PROFILE = synthetic_profile("over-context", engine={"context_length": CONTEXT},
                            prefill={"per_token_s": 0.1})


def _ids(n: int, token: int = 5) -> list[int]:
    # Token ids: counted exactly by the gateway, without a tokenizer.
    return [token] * n


@pytest.fixture
def overloaded_long_group(engine_launcher, tiny_engine_model, gateway_server):
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

    engines = engine_launcher.emulated_pd(tiny_engine_model, PROFILE)
    gateway = gateway_server(StaticDiscovery(StaticSpec((), (engines.prefill.url,), (engines.decode.url,)),
                                             poll_s=0.05),
                             length_threshold=64, max_pending_tokens_per_pod=BOUND,
                             served_model_name="test-model")
    held = RawRequest(gateway.url, "/v1/completions", {"prompt": _ids(300), "max_tokens": 1})

    def status() -> dict:
        return httpx.get(f"{gateway.url}/laps_status").json()

    poll(lambda: status()["groups"]["long"]["pending_tokens"] >= BOUND, message="the long group overloaded")
    poll(lambda: status()["max_prompt_tokens"] == CONTEXT - 1, message="the engines' limit to be known")
    yield gateway, engines
    held.hang_up()


def test_a_prompt_over_the_context_gets_the_engines_400_not_a_retryable_429(overloaded_long_group):
    gateway, engines = overloaded_long_group
    # A long prompt that fits is refused for the overload, as before (another token: one sharing
    # the held prompt's prefix would be short work on its pod, cache affinity).
    fits = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": _ids(200, 7), "max_tokens": 1})
    admission_refusal(fits, "no prefill pod would prefill this long request in time")

    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused")   # max_retries: 2
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="test-model", prompt=_ids(600), max_tokens=1)
    error = refused.value.body
    # What the engine itself answers for that prompt (the path without overload), word for word.
    engine = httpx.post(f"{engines.prefill.url}/v1/completions", json={"prompt": _ids(600), "max_tokens": 1})
    assert engine.status_code == 400
    assert error == engine.json()["error"]
    assert error["type"] == "context_length_exceeded"
    assert error["message"] == ("the prompt has 600 tokens; this engine takes at most 511: prompt + "
                                "completion must fit in its context of 512 tokens")
    metrics = httpx.get(f"{gateway.url}/metrics").text
    # Sent once, not resent: the SDK does not retry a 400; only the prompt that fits was a 429.
    assert metric_value(metrics, "laps_gateway_errors_total", reason="context_length_exceeded") == 1
    assert metric_value(metrics, "laps_gateway_rejected_total", **{"class": "long"}) == 1
