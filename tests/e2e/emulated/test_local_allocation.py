"""`laps local`'s own allocation loop (the operator's policy over the gateway's pending work):
under a load of long prompts a short engine moves to the long group, /laps_status says so, the
moved engine reports its new group, and long work then reaches it."""
from __future__ import annotations

import asyncio
import threading

import httpx
import yaml

from tests.support.emulated_profiles import synthetic_profile
from tests.support.metrics_text import metric_value as _metric
from tests.support.waiting import poll

PROFILE = synthetic_profile("test-slow-long", served="emulated-test",
                            engine={"kv_capacity_tokens": 262144, "context_length": 16384},
                            # long prompts take ~0.2 s each: a handful a second saturate one pod
                            prefill={"overhead_s": 0.010, "per_token_s": 0.0001}, decode={"overhead_s": 0.005},
                            transfer={"bytes_per_s": 1.0e9})



def test_long_load_moves_a_short_engine_to_the_long_group(laps_local, tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    stack = laps_local("--engine", "emulated", "--profile", str(path), "--prefill", "4", "--decode", "1",
                       "--allocation-interval", "1", timeout=120)
    status = httpx.get(stack.base + "/laps_status").json()
    assert status["allocation"]["enabled"] and status["allocation"]["mode"] == "laps"
    before = {g: [p["url"] for p in status["groups"][g]["pods"]] for g in ("short", "long")}
    assert [len(before["short"]), len(before["long"])] == [2, 2]

    stop = threading.Event()

    async def long_load() -> None:  # ~20 long prompts/s: the two long engines fall behind
        async with httpx.AsyncClient(base_url=stack.url, timeout=120) as client:
            tasks = set()
            while not stop.is_set():
                # Each prompt its own first token, so no two share a KV page (a repeat would be a
                # prefix-cache hit: short work).
                prompt = [1 + len(tasks) % 40000, *range(101, 2100)]
                tasks.add(asyncio.create_task(client.post("/completions", json={
                    "model": "emulated-test", "prompt": prompt, "max_tokens": 2})))
                await asyncio.sleep(0.05)  # the load's pace, not synchronisation
            await asyncio.gather(*tasks, return_exceptions=True)

    loader = threading.Thread(target=lambda: asyncio.run(long_load()), daemon=True)
    loader.start()
    try:
        moved = poll(lambda: httpx.get(stack.base + "/laps_status").json()["allocation"]["moves"],
                     timeout=60, interval=0.5, message="a move by the allocation loop")
    finally:
        stop.set()
        loader.join(120)
    first = moved[0]
    assert (first["from"], first["to"]) == ("short", "long") and first["pod"] in before["short"]
    status = httpx.get(stack.base + "/laps_status").json()
    groups = {g: [p["url"] for p in status["groups"][g]["pods"]] for g in ("short", "long")}
    assert first["pod"] in groups["long"] and first["pod"] not in groups["short"]
    assert first["pressure"]["long"] > first["pressure"]["short"]  # what the move was made on
    # the engine reports its new group, as a relabelled pod does
    assert httpx.get(first["pod"] + "/get_server_info").json()["prefill_group"] == "long"
    gateway = httpx.get(stack.base + "/metrics").text
    assert _metric(gateway, "laps_gateway_rebalances_total", direction="short_to_long") >= 1

    # long work now reaches the moved engine
    def long_batches() -> float:
        return _metric(httpx.get(first["pod"] + "/metrics").text,
                       "laps_engine_prefill_latency_seconds_count", 0.0, **{"class": "long"})

    seen = long_batches()
    for k in range(6):  # equal predictions rotate over the three idle long engines: all get some
        prompt = [45000 + k, *range(101, 1100)]   # new prompts: no pod holds them, no affinity
        reply = httpx.post(stack.url + "/completions", json={
            "model": "emulated-test", "prompt": prompt, "max_tokens": 1}, timeout=60)
        assert reply.status_code == 200
    assert long_batches() > seen


def test_laps_local_bounds_a_request_by_its_deadline(laps_local, tmp_path):
    """`laps local --request-deadline-s`: an answer that would take longer is cut with a 504
    naming the deadline, and a short one is served."""
    slow = {**PROFILE, "name": "slow-decode", "decode": {"overhead_s": 0.05}}
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(slow))
    stack = laps_local("--engine", "emulated", "--profile", str(path), "--prefill", "2", "--decode", "1",
                       "--no-allocation", "--request-deadline-s", "1", timeout=120)
    body = {"model": "emulated-test", "prompt": list(range(100, 140))}
    cut = httpx.post(stack.url + "/completions", json={**body, "max_tokens": 200}, timeout=30)
    assert cut.status_code == 504 and "1s deadline" in cut.json()["error"]["message"], cut.text
    assert httpx.post(stack.url + "/completions", json={**body, "max_tokens": 3}, timeout=30).status_code == 200
