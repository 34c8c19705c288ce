"""`laps local --autoscale`: the planner the operator runs, starting and stopping engine
processes under a load that rises and falls. Engines start when the load rises and the gateway
routes to them once they answer; when it falls, the engines leave routing, drain and stop while
requests still arrive, and not one request fails; /laps_status shows each decision."""
from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
import yaml

from tests.support.emulated_profiles import synthetic_profile
from tests.support.metrics_text import metric_value as _metric
from tests.support.waiting import poll

PROFILE = synthetic_profile("test-autoscale", served="emulated-test",
                            engine={"kv_capacity_tokens": 262144, "context_length": 16384},
                            # a 1500-token prompt takes ~0.16 s: a few a second fill one prefill engine
                            prefill={"overhead_s": 0.010, "per_token_s": 0.0001}, decode={"overhead_s": 0.005},
                            transfer={"bytes_per_s": 1.0e9})


class OpenLoad:
    """Requests of `tokens` prompt tokens every `gap_s` (open loop), each answer kept."""

    def __init__(self, url: str, tokens: int, gap_s: float) -> None:
        self.url, self.tokens, self.gap_s = url, tokens, gap_s
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=120) as client:
            tasks = set()
            n = 0
            while not self._stop.is_set():
                n += 1
                prompt = [1 + n % 40000, *range(101, 100 + self.tokens)]   # no two share a first page
                tasks.add(asyncio.create_task(self._one(client, prompt)))
                await asyncio.sleep(self.gap_s)   # the load's pace, not synchronisation
            await asyncio.gather(*tasks)

    async def _one(self, client: httpx.AsyncClient, prompt: list[int]) -> None:
        try:
            reply = await client.post("/completions", json={"model": "emulated-test", "prompt": prompt,
                                                            "max_tokens": 4})
            self.statuses.append(reply.status_code)
            if reply.status_code != 200:
                self.errors.append(f"{reply.status_code}: {reply.text[:200]}")
        except httpx.HTTPError as exc:
            self.errors.append(repr(exc))

    def start(self) -> OpenLoad:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(180)


def test_engines_start_with_the_load_and_drain_away_without_a_failed_request(laps_local, tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    stack = laps_local("--engine", "emulated", "--profile", str(path), "--prefill", "1", "--decode", "1",
                       "--autoscale", "--scale-interval", "2", "--prefill-max", "3", "--decode-max", "2",
                       "--scale-down-stabilization", "0", "--startup", "0", "--slo", "short=0.5,long=1",
                       timeout=120)

    def autoscaling() -> dict:
        return httpx.get(stack.base + "/laps_status").json()["autoscaling"]

    assert autoscaling()["enabled"] and autoscaling()["pods"] == {"prefill": 1, "decode": 1}
    # 4 long prompts a second: one engine keeps up (~6 a second), but not within the 1 s SLO at p90.
    loads = [OpenLoad(stack.url, 1500, 0.25).start()]
    try:
        grown = poll(lambda: (a := autoscaling())["pods"]["prefill"] >= 2 and a, timeout=60, interval=0.5,
                     message="the planner to start prefill engines")
        started = [d for d in grown["decisions"] if d["started"]]
        assert started and "req/s" in started[0]["reason"]
        # The new engines are routed to once they answer: the gateway lists them in its groups.
        poll(lambda: sum(len(g["pods"]) for g in httpx.get(stack.base + "/laps_status").json()["groups"].values())
             >= 2, timeout=60, interval=0.5, message="the gateway to route to a new engine")

        # The load falls but goes on: engines leave routing, drain and stop under it.
        loads[0].stop()
        loads.append(OpenLoad(stack.url, 1500, 1.0).start())   # one a second
        poll(lambda: (a := autoscaling())["pods"]["prefill"] == 1 and not a["draining"], timeout=90, interval=0.5,
             message="the planner to drain engines away, back to one prefill engine")
        stopped = [d for d in autoscaling()["decisions"] if d["stopping"]]
        assert stopped
        poll(lambda: any("drained and stopped" in line for line in stack.read_output()), timeout=30,
             message="an engine stopped after its drain")
        # The decode engine measured its steps (the planner's decode cost against the ITL SLO).
        decode = httpx.get(stack.base + "/laps_status").json()["decode"]["pods"][0]["url"]
        page = httpx.get(decode + "/metrics").text
        one_request_step = sum(_metric(page, "laps_engine_decode_cost_seconds", term=t) for t in ("overhead", "per_request"))
        assert one_request_step == pytest.approx(0.005, rel=0.2)   # the profile's step: 5 ms
    finally:
        for load in loads:
            load.stop()
    statuses = [s for load in loads for s in load.statuses]
    assert statuses and all(s == 200 for s in statuses), [e for load in loads for e in load.errors][:5]
    assert not [e for load in loads for e in load.errors]
