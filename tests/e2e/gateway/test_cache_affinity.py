"""Cache affinity through a real gateway (issue 12): stub PD engines on loopback, conversations
of several turns sent one after another; every later turn reaches the prefill pod that served
the conversation's first turn, and the gateway classifies it by what that pod does not hold."""
from __future__ import annotations

import httpx

from tests.support.fixtures_gateway import poll
from tests.support.metrics_text import metric_value
from tests.support.stub_engine import KVHandoff


def _pods_that_got_one(prefills, before: list[int]) -> list[int]:
    return [i for i, (_, engine) in enumerate(prefills) if len(engine.requests) > before[i]]


def _two_short_two_long(stub_engines, gateway_server):
    """A gateway over prefill stubs 0-1 (short group) and 2-3 (long group) and a decode stub."""
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

    handoff = KVHandoff()  # the decode stub answers only after its prefill stub has the request
    prefills = [stub_engines("prefill", handoff=handoff) for _ in range(4)]
    decode, _ = stub_engines("decode", handoff=handoff)
    spec = StaticSpec(tuple(s.url for s, _ in prefills[:2]), tuple(s.url for s, _ in prefills[2:]),
                      (decode.url,))
    discovery = StaticDiscovery(spec)
    gateway = gateway_server(discovery, engine_load_poll=False)
    poll(lambda: sum(len(g) for g in discovery.membership().groups.values()) == 4,
         message="all four prefill stubs")
    return gateway, prefills


def test_conversations_stick_to_the_pod_that_holds_them(stub_engines, gateway_server):
    gateway, prefills = _two_short_two_long(stub_engines, gateway_server)
    served: dict[int, list[int]] = {}
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        for turn in range(4):
            for conv in range(6):
                # Conversations 0-2 open long (~500 tokens), 3-5 short; later turns add a short
                # answer and a short question.
                opening = (f"conversation {conv} opens " + "with many words " * (160 if conv < 3 else 3)).strip()
                messages = [{"role": "user", "content": opening}]
                for t in range(turn):
                    messages += [{"role": "assistant", "content": f"answer {t} ok ok"},
                                 {"role": "user", "content": f"question {t + 1} of {conv}?"}]
                before = [len(engine.requests) for _, engine in prefills]
                reply = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
                assert reply.status_code == 200, reply.text
                got = _pods_that_got_one(prefills, before)
                assert len(got) == 1
                served.setdefault(conv, []).append(got[0])
        metrics = client.get("/metrics").text
    for conv, pods in served.items():
        assert len(set(pods)) == 1, f"conversation {conv} moved between pods: {pods}"
        # Long openings went to the long group, short ones to the short group.
        assert (pods[0] >= 2) == (conv < 3)
    # 6 conversations x 3 later turns each found their pod holding the earlier turns...
    assert metric_value(metrics, "laps_gateway_affinity_routes_total", outcome="hit") == 18
    # ...and the long conversations' later turns, ~500 tokens in all but a few new ones, were
    # classified short on their long pods.
    assert metric_value(metrics, "laps_gateway_requests_total", **{"class": "short", "group": "long"}) == 9


def test_long_prompts_sharing_a_system_prompt_with_short_ones_go_to_the_long_group(stub_engines, gateway_server):
    gateway, prefills = _two_short_two_long(stub_engines, gateway_server)
    system = {"role": "system", "content": "You are a helpful assistant. Answer briefly. " * 4}
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        # Every user of the service has the same system prompt; a short question puts it on a
        # short pod first, then other users ask long questions (~500 tokens).
        first = client.post("/v1/chat/completions", json={
            "messages": [system, {"role": "user", "content": "hi"}], "max_tokens": 2})
        assert first.status_code == 200, first.text
        for user in range(4):
            before = [len(engine.requests) for _, engine in prefills]
            question = f"user {user} asks " + "about many long words " * 100
            reply = client.post("/v1/chat/completions", json={
                "messages": [system, {"role": "user", "content": question}], "max_tokens": 2})
            assert reply.status_code == 200, reply.text
            assert _pods_that_got_one(prefills, before)[0] >= 2, f"user {user}'s long prompt went to a short pod"
        metrics = client.get("/metrics").text
    assert metric_value(metrics, "laps_gateway_requests_total", **{"class": "long", "group": "long"}) == 4
    assert metric_value(metrics, "laps_gateway_requests_total", **{"class": "long", "group": "short"}) == 0
