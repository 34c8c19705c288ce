"""`laps local` as a user runs it: starts, answers the openai client, and Ctrl-C leaves no
process behind."""
from __future__ import annotations

import httpx
import openai

from laps_agent.policy.classes import CLASSES


def test_laps_local_serves_and_stops_cleanly(laps_local, tiny_engine_model):
    stack = laps_local("--model", str(tiny_engine_model), "--prefill", "2", "--decode", "1",
                       "--length-threshold", "16", "--torch-threads", "1", "--kv-pages", "512",
                       "--wait-window-ms", "0")
    assert any("ready" in line for line in stack.output)  # progress while loading
    assert len(stack.engines) >= 3

    client = openai.OpenAI(base_url=stack.url, api_key="unused", timeout=120, max_retries=0)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=4)
    assert reply.choices[0].message.content
    client.close()
    status = httpx.get(stack.base + "/laps_status").json()
    assert [len(status["groups"][g]["pods"]) for g in CLASSES] == [1, 1]
    for group in CLASSES:  # each engine reports the group it was put in
        pod_url = status["groups"][group]["pods"][0]["url"]
        assert httpx.get(pod_url + "/get_server_info").json()["prefill_group"] == group
    stack.stop()  # Ctrl-C: exit code 0 and every engine process gone (asserted by stop)
