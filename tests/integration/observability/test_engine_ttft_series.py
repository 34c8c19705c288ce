"""One request, one `laps_engine_ttft_seconds` sample: the one of the engine that made its first
token. The dashboard's engine TTFT panel sums the histogram over every engine pod of a namespace;
a decode engine that also counted a "TTFT" (from the moment its KV arrived: near zero) put one
bogus sample beside every real one, and a p50 over the panel's sum read the decode engines'
import time instead of the prefill engines' TTFT."""
from __future__ import annotations

import httpx
import openai

from tests.support.metrics_text import metric_value

TTFT = "laps_engine_ttft_seconds_count"


def _ttft_count(engine) -> float:
    text = httpx.get(engine.url + "/metrics", timeout=10).text
    return sum(metric_value(text, TTFT, 0, **{"class": c}) for c in ("short", "long"))


def test_each_request_is_one_ttft_sample_at_its_prefill_engine(tiny_pd_engines, gateway_server):
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

    prefill, decode = tiny_pd_engines.prefill, tiny_pd_engines.decode
    gateway = gateway_server(StaticDiscovery(StaticSpec((prefill.url,), (prefill.url,), (decode.url,)),
                                             poll_s=0.05), served_model_name="test-model")
    before = {"prefill": _ttft_count(prefill), "decode": _ttft_count(decode)}
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", timeout=120, max_retries=0)
    sent = 3
    for i in range(sent):
        stream = client.completions.create(model="test-model", prompt=f"count me {i}", max_tokens=2,
                                           temperature=0, stream=bool(i % 2))
        if i % 2:
            assert list(stream)
        else:
            assert stream.choices[0].text is not None
    client.close()

    # The prefill engine answered every request's first token before the decode engine replied,
    # so both pages are final once the client has its answers.
    assert _ttft_count(prefill) - before["prefill"] == sent
    assert _ttft_count(decode) - before["decode"] == 0
