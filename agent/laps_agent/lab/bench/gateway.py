"""`laps bench gateway`: what the gateway adds on top of its upstreams, measured in one run.

Emulated prefill/decode engines with the compute-free `instant` profile (`laps engine --backend
emulated`: the engines' real HTTP and PD protocol, no model; a word-level tokenizer written for
the run keeps their own cost low, _gateway_stack.word_tokenizer) and `laps gateway` run as
separate processes on loopback. Latency: every client alternates *direct* calls (prefill +
decode posted concurrently, as the gateway does) with calls *via the gateway*; the added latency
is the difference of their percentiles. Gateway CPU per request: its process's /proc accounting
(load poller included). A control row sends 1 KiB through the gateway while the direct calls
carry 40 KiB, as busy a machine as the 40 KiB row: the two rows' CPU difference is what the
larger body costs the gateway. Scale-out: the rate one gateway, then two replicas, sustain under
saturation over compute-free stub upstreams (_stub_upstream.py), next to the ceiling the shared
cores allow (1/X for one, min(2/X, cores/(X+Y)) for two; X: a gateway's CPU per request, Y: the
load generator's and the stubs'). Method, caveats, figures: docs/design/gateway-overhead.md."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

from laps_agent.lab.bench._gateway_report import Cell, latency_row, scale_out_row, table
from laps_agent.lab.bench._gateway_stack import Child, spawn_engine, spawn_gateway, spawn_stub_upstreams, word_tokenizer
from laps_agent.lab.bench._http_load import LoadClient
from laps_agent.policy.classes import LONG, SHORT
from laps_agent.policy.routing import Endpoint, EndpointLoad, choose_route
from laps_agent.serving.flag_types import positive, positive_ints

_WORDS = ("the prefill pod computes the prompt's KV cache, then hands it to a decode pod; "
          "requests of 1024 tokens or more are long (see docs/contracts.md).\n").split(" ")


def make_body(size: int) -> dict:
    """A completion request whose JSON is about `size` bytes: prose with digits, punctuation and
    line breaks (what the estimate counts), not one repeated character."""
    base = {"model": "default", "prompt": "", "max_tokens": 4, "stream": False}
    words, total = [], len(json.dumps(base))
    rng = random.Random(size)
    while total < size:
        word = rng.choice(_WORDS)
        words.append(word)
        total += len(json.dumps(word)) - 1
    return {**base, "prompt": " ".join(words)}


class Client:
    def __init__(self, prefill: str, decode: str) -> None:
        self.http = LoadClient()
        self.prefill, self.decode = prefill, decode
        # The decode engine collects the KV from the prefill engine's bootstrap port, as through
        # the gateway.
        self.bootstrap_port = httpx.get(prefill + "/get_server_info", trust_env=False).json()["bootstrap_port"]

    def direct_head(self, body: dict) -> bytes:
        """The body with the PD fields but the room, which each call appends (encoded once)."""
        return json.dumps(body).encode()[:-1] + (
            b',"bootstrap_host":"127.0.0.1","bootstrap_port":%d,"bootstrap_room":' % self.bootstrap_port)

    async def direct(self, head: bytes) -> float:
        payload = head + b"%d}" % random.getrandbits(63)
        prefill = asyncio.ensure_future(self.http.post(self.prefill + "/v1/completions", payload))
        status, first = await self.http.post(self.decode + "/v1/completions", payload)
        await prefill
        return _checked(status, first)

    async def via(self, gateway: str, payload: bytes) -> float:
        return _checked(*await self.http.post(gateway + "/v1/completions", payload))


def _checked(status: int, seconds: float) -> float:
    if status != 200:
        raise RuntimeError(f"benchmark request failed with {status}")
    return seconds


async def _closed_loop(client: Client, gateway: str, body: dict, direct_body: dict, clients: int,
                       seconds: float) -> tuple[list[float], list[float]]:
    """`clients` concurrent clients, each alternating a direct and a gateway call."""
    head, payload = client.direct_head(direct_body), json.dumps(body).encode()
    direct: list[float] = []
    via: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def one(i: int) -> None:
        turn = i % 2
        while time.perf_counter() < stop_at:
            if turn:
                direct.append(await client.direct(head))
            else:
                via.append(await client.via(gateway, payload))
            turn ^= 1

    await asyncio.gather(*(one(i) for i in range(clients)))
    return direct, via


def _cells(args) -> list[Cell]:
    cells = []
    for kib in args.sizes:
        for clients in args.clients:
            cells.append(Cell(kib, clients))
            if kib == args.sizes[0] and clients == 1:
                cells.append(Cell(kib, clients, stream=True))
    if len(args.sizes) > 1 and 1 in args.clients:  # see the module docstring
        cells.append(Cell(args.sizes[0], 1, direct_kib=args.sizes[-1]))
    return cells


async def _latency(args, client: Client, gateway: Child) -> list[dict]:
    rows = []
    for kib in args.sizes:  # warm-up: connections, code paths
        await _closed_loop(client, gateway.url, make_body(kib * 1024), make_body(kib * 1024), 4, 0.5)
    for cell in _cells(args):
        body = {**make_body(cell.kib * 1024), "stream": cell.stream}
        direct_body = make_body((cell.direct_kib or cell.kib) * 1024) if cell.direct_kib else body
        cpu0 = gateway.cpu_seconds()
        direct, via = await _closed_loop(client, gateway.url, body, direct_body, cell.clients, args.seconds)
        rows.append(latency_row(cell, direct, via, gateway.cpu_seconds() - cpu0))
    return rows


async def _saturate(http: LoadClient, gateways: list[Child], others: list[Child], payload: bytes,
                    clients: int, seconds: float) -> dict:
    """Closed loop through the gateways only (clients spread over them). `others`: the
    upstream processes, whose CPU counts with this process's (the load generator's)."""
    done = 0
    stop_at = time.perf_counter() + seconds

    async def one(url: str) -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            _checked(*await http.post(url + "/v1/completions", payload))
            done += 1

    cpu0 = [g.cpu_seconds() for g in gateways]
    rest0 = time.process_time() + sum(o.cpu_seconds() for o in others)
    start = time.perf_counter()
    await asyncio.gather(*(one(gateways[i % len(gateways)].url) for i in range(clients)))
    elapsed = time.perf_counter() - start
    cpu = sum(g.cpu_seconds() - c for g, c in zip(gateways, cpu0))
    rest = time.process_time() + sum(o.cpu_seconds() for o in others) - rest0
    return {"req_per_s": done / elapsed, "cpu_share": cpu / elapsed,
            "req_per_cpu_s": done / cpu if cpu else float("nan"),
            "gateway_cpu_ms": 1e3 * cpu / max(done, 1), "rest_cpu_ms": 1e3 * rest / max(done, 1)}


async def _scale_out(args, gateways: list[Child], stubs: Child) -> dict:
    http = LoadClient()
    payload = json.dumps(make_body(1024)).encode()
    try:
        await _saturate(http, gateways, [stubs], payload, args.scale_clients, 0.5)  # warm-up
        one = await _saturate(http, gateways[:1], [stubs], payload, args.scale_clients, args.seconds)
        two = await _saturate(http, gateways, [stubs], payload, args.scale_clients, args.seconds)
    finally:
        await http.aclose()
    return scale_out_row(args.scale_clients, os.cpu_count() or 0, one, two)


async def _run(args, prefill: Child, decode: Child, gateway: Child) -> list[dict]:
    client = Client(prefill.url, decode.url)
    try:
        return await _latency(args, client, gateway)
    finally:
        await client.http.aclose()


def _scale_out_over_stubs(args) -> dict:
    stubs = spawn_stub_upstreams()
    children = [stubs]
    try:
        for _ in range(2):
            children.append(spawn_gateway(*stubs.urls, *args.gateway_arg))
        return asyncio.run(_scale_out(args, children[1:], stubs))
    finally:
        for child in reversed(children):
            child.stop()


def bench_routing(n: int = 200_000) -> float:
    """Routing decisions per second, in-process, for 3 short + 3 long prefill pods and 2 decode
    pods with changing loads (what the gateway does once per request: policy.routing.choose_route)."""
    def ep(name: str) -> Endpoint:
        return Endpoint(name, f"http://{name}:30000", name, 8998)

    groups = {SHORT: [ep(f"ps{i}") for i in range(3)], LONG: [ep(f"pl{i}") for i in range(3)]}
    decode = [ep(f"d{i}") for i in range(2)]
    names = [e.name for g in groups.values() for e in g] + [e.name for e in decode]
    load = {name: EndpointLoad() for name in names}
    states = list(load.values())
    exclude: frozenset[str] = frozenset()
    start = time.perf_counter()
    for i in range(n):
        state = states[i % len(states)]
        state.pending_tokens = (i * 7919) % 4096   # loads move between decisions
        state.pending_requests = i % 5
        choose_route((i * 37) % 600, 256, groups, decode, load, exclude, i)
    elapsed = time.perf_counter() - start
    return n / elapsed if elapsed > 0 else float("inf")


def _routing_rate() -> dict:
    return {"mode": "routing decisions (in-process)", "decisions_per_s": float(bench_routing())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="laps bench gateway", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=positive(float), default=5.0, help="per measurement")
    p.add_argument("--sizes", type=positive_ints, default=[1, 40], help="body sizes in KiB, comma-separated")
    p.add_argument("--clients", type=positive_ints, default=[1, 8, 32], help="concurrent clients, comma-separated")
    p.add_argument("--scale-clients", type=positive(int), default=32, help="clients of the scale-out phase")
    p.add_argument("--no-scale-out", action="store_true", help="skip the two-gateway phase")
    p.add_argument("--gateway-arg", action="append", default=[],
                   help="extra `laps gateway` flag (repeatable), e.g. --gateway-arg=--no-engine-load-poll")
    p.add_argument("--json", action="store_true", help="print one JSON object per result")
    args = p.parse_args(argv)
    try:
        rows = _measure_all(args)
    except RuntimeError as exc:  # a process that did not start (a bad --gateway-arg: its own
        # error is printed above), a request that failed
        print(f"laps bench gateway: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the processes are stopped; the table is printed only at the end
        print("laps bench gateway: interrupted", file=sys.stderr)
        return 130
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        print(table(rows))
    return 0


def _measure_all(args: argparse.Namespace) -> list[dict]:
    workdir = Path(tempfile.mkdtemp(prefix="laps-bench-gateway-"))
    children: list[Child] = []
    try:  # the temp dir goes too when an engine fails to start or a Ctrl-C comes meanwhile
        tokenizer = word_tokenizer(workdir / "tokenizer", (w.strip() for w in _WORDS))
        prefill = spawn_engine("prefill", tokenizer)
        children.append(prefill)
        decode = spawn_engine("decode", tokenizer)
        children.append(decode)
        children.append(spawn_gateway(prefill.url, decode.url, *args.gateway_arg))
        rows = asyncio.run(_run(args, prefill, decode, children[-1]))
    finally:
        for child in reversed(children):
            child.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    if not args.no_scale_out:
        rows.append(_scale_out_over_stubs(args))
    rows.append(_routing_rate())
    return rows


if __name__ == "__main__":
    sys.exit(main())
