"""Real SGLang PD with the LAPS plugin: a prefill server (plugin on) and a decode server on
loopback (mooncake_tcp), this project's gateway in front, the official `openai` client; then a
burst of mixed requests whose batch order shows the LAPS policy at work inside SGLang."""
from __future__ import annotations

import os
import threading
import time

import httpx
import pytest

from laps_agent.local.engines import free_ports
from tests.sglang.burst import L1_WORDS, Sender, plugin_batches, prompt, send_short_first_burst
from tests.sglang.conftest import start_prefill
from tests.support.metrics_text import metric_value
from tests.support.waiting import poll

pytestmark = pytest.mark.sglang

# The bound sits between how long L2 waits for L1 (444 tokens: ~4 s on a 2-core AMD EPYC in
# float32, ~2 s on faster cores) and how long L3 waits for BIG (3701 tokens: ~23 s, ~12 s):
# about 2x margin either way on both kinds of machine.
WINDOW_MS, LONG_BOUND_MS, THRESHOLD = 300, 7000, 256


@pytest.fixture(scope="module")
def laps_prefill(sglang_logs, retire):
    log = sglang_logs / "laps-batches.jsonl"
    labels = sglang_logs / "podinfo-labels"  # the downward-API file the operator mounts
    labels.write_text('app="laps"\nlaps.io/prefill-group="short"\n')
    server = start_prefill(sglang_logs, {
        "LAPS_SCHEDULER": "1", "LAPS_LENGTH_THRESHOLD": str(THRESHOLD),
        "LAPS_WAIT_WINDOW_MS": str(WINDOW_MS), "LAPS_WAIT_MAX_BATCH": "8",
        "LAPS_MAX_LONG_WAIT_MS": str(LONG_BOUND_MS), "LAPS_BATCH_LOG": str(log),
        "LAPS_LABELS_FILE": str(labels)})
    server.batch_log, server.labels_file = log, labels
    try:
        yield server.wait_ready()
    finally:
        retire(server)


@pytest.fixture(scope="module")
def gateway(laps_prefill, decode_server, gateway_for):
    return gateway_for(laps_prefill, decode_server)


def test_openai_client_through_gateway_and_real_pd(gateway, laps_prefill, decode_server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{gateway}/v1", api_key="unused", timeout=120)
    done = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=8,
                                     temperature=0)
    # Same greedy text as Hugging Face transformers gives for this prompt: the KV really moved.
    assert "Paris" in done.choices[0].text
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=16, temperature=0)
    text = chat.choices[0].message.content
    assert text and chat.usage.completion_tokens > 0
    stream = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=16,
                                            temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == text  # greedy: streaming and not streaming agree
    pieces = list(client.completions.create(model="smollm2", prompt="The capital of France is",
                                            max_tokens=8, temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in pieces if p.choices) == done.choices[0].text
    assert "LAPS scheduler active" in laps_prefill.log_text()
    # The decode server's slots go in first-token deadline order (the operator's decode-pod env:
    # conftest.DECODE_PLUGIN_ENV); the answers above passed through that hook.
    assert "LAPS decode order active" in decode_server.log_text()


def _after(batches: list[dict], start: int) -> list[dict]:
    return batches[start:]


def _index_of(batches: list[dict], rid: str) -> int:
    # The gateway makes a client's rid unique per attempt: `<rid>-<room in hex>`.
    return next(i for i, b in enumerate(batches) if any(r.startswith(f"{rid}-") for r in b["rids"]))


def _wait_long_dispatched(server, seen: int) -> int:
    """Index of the first long batch logged after the first `seen` batches (sync point: the
    long request is now running, so what comes next queues behind it)."""
    def found():
        batches = plugin_batches(server.batch_log)
        return next((i + 1 for i, b in enumerate(batches) if i >= seen and b["queue"] == "long"), None)
    return poll(found, timeout=120, message="the long request's batch to start") - 1


def test_plugin_schedules_short_first_with_window_and_starvation_bound(gateway, laps_prefill, decode_server,
                                                                     gateway_for):
    server = laps_prefill
    # C. The window: short requests ~20 ms apart on an idle server wait for each other and go
    # as one batch (without a window each would run alone as it arrives). The first of the
    # burst may run alone: the window holds only where another short is expected (the last
    # gap or the mean one), and what this server saw before (the tests above) sets the mean.
    # The gaps SGLang sees are the sent ones plus up to ~0.1 s of this busy machine's threads:
    # sent 60 ms apart they reached 160 ms, and a gap over half the 300 ms window expects none.
    start = len(plugin_batches(server.batch_log))
    s = Sender(gateway)
    for i in range(4):
        s.send(f"w{i}", prompt(12 + 3 * i, seed=100 + i))
        if i < 3:
            time.sleep(0.02)  # the workload's shape (arrivals spread within the window), not a sync
    s.join()
    window = _after(plugin_batches(server.batch_log), start)
    assert any(b["queue"] == "short" and len(b["rids"]) >= 2 and b["reason"] == "short_window_expired"
               for b in window), window

    # A. Short first, on a long-group pod: while a long request runs, another long one and four
    # short ones arrive (the long one sent first); the short ones run before it, batched
    # together. Through a gateway whose short group's one pod is down (nothing listens on its
    # port), so the shorts go to the SGLang server as the long group's pod (groups are a
    # preference): its queued long work does not hold them back.
    down = f"http://127.0.0.1:{free_ports(1)[0]}"
    long_only = gateway_for(laps_prefill, decode_server, short=(down,))
    seen = len(plugin_batches(server.batch_log))
    a = Sender(long_only)
    a.send("L1", prompt(L1_WORDS, seed=1))
    first = _wait_long_dispatched(server, seen)
    send_short_first_burst(a)
    done = a.join()
    tokens = {name: t for name, (_, t) in done.items()}
    assert all(tokens[f"S{i}"] <= THRESHOLD < tokens["L2"] for i in range(4)), tokens
    batches = _after(plugin_batches(server.batch_log), first)
    l2 = _index_of(batches, a.rids["L2"])
    shorts = [_index_of(batches, a.rids[f"S{i}"]) for i in range(4)]
    assert max(shorts) < l2, batches
    assert len({batches[i]["reason"] for i in shorts} - {"short_window_cut_for_long", "short_window_expired",
                                                          "short_target_depth", "short_batch_full", "short"}) == 0
    assert len(set(shorts)) < len(shorts), f"short requests were not batched together: {batches}"
    fallbacks = metric_value(httpx.get(f"{long_only}/metrics", timeout=10).text, "laps_gateway_fallbacks_total",
                             default=0, **{"class": "short"})
    assert fallbacks >= 4   # the gateway placed the shorts on the long-group pod

    # B. Starvation bound: a long request that has waited LONG_BOUND_MS behind a big one runs
    # next even though short requests wait too.
    seen = len(plugin_batches(server.batch_log))
    b = Sender(gateway)
    b.send("BIG", prompt(2550, seed=3))  # ~3800 tokens: one chunk (4096)
    first = _wait_long_dispatched(server, seen)
    b.send("L3", prompt(540, seed=4))
    for i in range(3):
        b.send(f"T{i}", prompt(17 + 4 * i, seed=20 + i))
    done = b.join()
    assert sorted(done) == ["BIG", "L3", "T0", "T1", "T2"]
    batches = _after(plugin_batches(server.batch_log), first)
    l3 = _index_of(batches, b.rids["L3"])
    assert batches[l3]["reason"] == "long_starved", batches
    assert batches[l3]["waited_s"][0] >= LONG_BOUND_MS / 1000, batches  # counted from arrival
    assert all(_index_of(batches, b.rids[f"T{i}"]) > l3 for i in range(3)), batches

    # The same story in the builtin engine's series, from SGLang's own /metrics.
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    for series in ('laps_engine_ttft_seconds_count{class="short"}', 'laps_engine_ttft_seconds_count{class="long"}',
                   'laps_engine_prefill_latency_seconds_count{class="long"}', "laps_engine_prefill_batch_size_count",
                   'laps_engine_queue_requests{queue="short"}'):
        assert series in metrics, series
    short_ttft = next(line for line in metrics.splitlines() if line.startswith('laps_engine_ttft_seconds_count{class="short"}'))
    assert float(short_ttft.split()[-1]) >= 7

    # Once the burst is over the engine reports itself idle: no running request, no KV held
    # (the evictable prefix cache is not use). Before, both kept the last batch's load.
    def idle_load():
        page = httpx.get(f"{server.url}/metrics", timeout=10).text
        load = [metric_value(page, name) for name in ("laps_engine_running_requests", "laps_engine_kv_usage_ratio")]
        return load if load == [0, 0] else None

    poll(idle_load, timeout=60, message="the engine's running requests and KV usage back at 0")


def test_the_gateway_routes_by_what_sglang_reports_it_holds(gateway, laps_prefill, decode_server):
    """Stock SGLang has no /get_load: the gateway reads its /v1/loads instead, so gateway
    replicas share what SGLang holds (docs/sglang.md, "Behind the gateway")."""
    def reports() -> dict:
        status = httpx.get(f"{gateway}/laps_status", timeout=10).json()
        pods = [p for group in status["groups"].values() for p in group["pods"]] + status["decode"]["pods"]
        return {p["url"]: p["engine_load"] for p in pods}

    # The previous test's last requests may still be leaving SGLang (the prefill server frees a
    # request once its KV transfer is acknowledged, after the client has its answer): wait for
    # each server to report itself idle rather than expecting it of the first report.
    def all_idle():
        r = reports()
        return r if all(x is not None and x["requests"] == 0 for x in r.values()) else None

    idle = poll(all_idle, timeout=60, message="an idle load report from each SGLang server")
    assert set(idle) == {laps_prefill.url, decode_server.url}
    # SGLang's report also gives the decode server's slots (max running requests), so the
    # decode share (each class's bound there) holds in front of SGLang too.
    decode = httpx.get(f"{gateway}/laps_status", timeout=10).json()["decode"]
    assert decode["slots"] > 0 and 1 <= decode["max_held_per_class"] < decode["slots"], decode
    # A long answer (300 decode steps, seconds here): the decode server reports it held. (Not a
    # long prefill: SGLang's scheduler answers /v1/loads between forward passes, and one CPU
    # prefill pass of thousands of tokens outlasts the poll's timeout; GPU passes take ms.)
    answer: dict = {}

    def generate() -> None:
        answer["reply"] = httpx.post(f"{gateway}/v1/completions", timeout=300, json={
            "model": "smollm2", "prompt": "Count slowly:", "max_tokens": 300, "ignore_eos": True,
            "temperature": 0})

    thread = threading.Thread(target=generate, daemon=True)
    thread.start()
    held = poll(lambda: (lambda r: r if r and r["requests"] >= 1 else None)(reports()[decode_server.url]),
                timeout=120, message="SGLang's decode server to report the answer it is generating")
    assert held["age_s"] < 5
    thread.join(300)
    assert answer["reply"].status_code == 200 and answer["reply"].json()["usage"]["completion_tokens"] == 300
    poll(lambda: (reports()[decode_server.url] or {}).get("requests") == 0, timeout=60,
         message="the report to show the decode server idle again")


def test_requests_pd_cannot_serve_get_a_clear_4xx_and_leave_the_servers_serving(gateway, laps_prefill):
    """n > 1 and token ids outside the vocabulary, through the gateway to real SGLang PD. Before,
    n=2 got no answer at all (SGLang's decode server never answered it) and a prompt of token
    id -1 crashed the prefill server's scheduler (then the gateway's retry, the next pod's)."""
    import openai

    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", timeout=60, max_retries=0)
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError, match="n=2 is not supported"):
        client.chat.completions.create(model="smollm2", messages=messages, max_tokens=4, n=2)
    with pytest.raises(openai.BadRequestError, match="n=3 is not supported"):
        client.completions.create(model="smollm2", prompt="Hi", max_tokens=4, n=3)
    with pytest.raises(openai.BadRequestError, match="token id -1"):
        client.completions.create(model="smollm2", prompt=[28, -1], max_tokens=4)
    native = httpx.post(f"{gateway}/generate", timeout=60,
                        json={"input_ids": [[28], [-7]], "sampling_params": {"max_new_tokens": 2}})
    assert native.status_code == 400 and "token id -7" in native.json()["error"]["message"]
    # Nothing was lost or left behind: the prefill server still serves, the gateway holds nothing.
    done = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=4,
                                     temperature=0)
    assert "Paris" in done.choices[0].text and laps_prefill.proc.poll() is None
    def idle() -> bool:
        metrics = httpx.get(f"{gateway}/metrics", timeout=10).text
        return all(metric_value(metrics, name, group=group) == 0 for group in ("short", "long")
                   for name in ("laps_gateway_pending_requests", "laps_gateway_pending_tokens"))

    poll(idle, timeout=30, message="the gateway's pending figures to be back at zero")


def test_an_over_context_prompt_gets_sglangs_own_400_from_the_gateway(gateway, laps_prefill):
    """Stock SGLang reports no prompt limit in its load: the gateway asks its context once
    (/v1/models, /server_info) and answers a prompt SGLang would refuse for its length itself,
    ahead of admission (never a 429 an SDK resends), in SGLang's own words."""
    import openai

    context = httpx.get(f"{laps_prefill.url}/v1/models", timeout=10).json()["data"][0]["max_model_len"]
    poll(lambda: httpx.get(f"{gateway}/laps_status", timeout=10).json()["max_prompt_tokens"] == context - 1,
         timeout=90, message="the gateway to learn SGLang's context length")
    over = {"model": "smollm2", "prompt": [28] * context, "max_tokens": 1}
    own = httpx.post(f"{laps_prefill.url}/v1/completions", timeout=60, json=over)   # SGLang's answer
    assert own.status_code == 400, own.text
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", timeout=60, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(**over)
    assert refused.value.body["message"] == own.json()["message"]
    metrics = httpx.get(f"{gateway}/metrics", timeout=10).text
    assert metric_value(metrics, "laps_gateway_errors_total", reason="context_length_exceeded") == 1


def test_engine_info_follows_the_operator_relabelling_the_pod(laps_prefill):
    """The operator moves a prefill pod between the short and long groups by relabelling it; the
    kubelet rewrites the labels file, and `laps_engine_info{group}` follows, as the builtin
    engine's does (prometheus_client's multiprocess mode keeps the former group's series, at 0)."""
    absent = -1.0

    def info() -> dict[str, float]:
        page = httpx.get(f"{laps_prefill.url}/metrics", timeout=10).text
        return {group: metric_value(page, "laps_engine_info", default=absent, role="prefill", group=group,
                                    model="smollm2") for group in ("short", "long")}

    assert info() == {"short": 1, "long": absent}
    new = laps_prefill.labels_file.with_name("podinfo-labels.new")
    new.write_text('app="laps"\nlaps.io/prefill-group="long"\n')
    os.replace(new, laps_prefill.labels_file)  # whole, as the kubelet swaps it
    poll(lambda: info() == {"short": 0, "long": 1}, timeout=30, message="laps_engine_info to show the long group")


def test_a_batch_sent_twice_at_once_with_the_clients_rids_is_answered_both_times(gateway):
    """SGLang's /generate takes a list of prompts with a list of rids, each of which must be
    unique inside SGLang; a client may send the same batch twice (a retry, two workers alike).
    The gateway makes each rid unique per attempt, as it does a single one: the engines see four
    requests, each still named by the client's rid."""
    from concurrent.futures import ThreadPoolExecutor

    body = {"text": ["The capital of France is", "One, two, three,"], "rid": ["job-a", "job-b"],
            "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    with ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda _: httpx.post(f"{gateway}/generate", json=body, timeout=120), range(2)))
    for reply in replies:
        assert reply.status_code == 200, reply.text
        answers = reply.json()
        assert "Paris" in answers[0]["text"]
        assert [a["meta_info"]["id"].rsplit("-", 1)[0] for a in answers] == ["job-a", "job-b"]
    assert len({a["meta_info"]["id"] for reply in replies for a in reply.json()}) == 4
