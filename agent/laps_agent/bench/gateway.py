"""`laps bench gateway`: what the gateway adds on top of its upstreams, measured in one run.

Emulated prefill/decode engines with the compute-free `instant` profile (`laps engine --backend
emulated`: the engines' real HTTP and PD protocol, no model) and the gateway (`laps gateway`) run as
separate processes on loopback. The client interleaves two kinds of calls: *direct*
(prefill + decode posted concurrently by the client itself, exactly what the gateway does) and
*via the gateway*; the added latency is the difference of their percentiles. CPU time per
request is read from the gateway process's own /proc accounting."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

from laps_agent.bench._http_load import LoadClient

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Child:
    proc: subprocess.Popen
    url: str

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _spawn_engine(role: str) -> Child:
    from laps_agent.local_engines import free_port

    port, boot = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "laps_agent.cli", "engine", "--backend", "emulated",
                             "--profile", "instant", "--role", role, "--host", "127.0.0.1",
                             "--port", str(port), "--bootstrap-port", str(boot),
                             "--labels-file", "/nonexistent", "--log-level", "warning"],
                            stdout=subprocess.DEVNULL)
    child = Child(proc, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(child.url + "/health", trust_env=False).status_code == 200:
                return child
        except httpx.HTTPError:
            pass
        time.sleep(0.05)  # poll interval, bounded by the deadline
    child.stop()
    raise RuntimeError(f"emulated {role} engine did not start (rc={proc.poll()})")


def _spawn(argv: list[str], marker: str) -> Child:
    proc = subprocess.Popen([sys.executable, "-m", *argv], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if marker in line:
            port = int(line.rsplit(":", 1)[-1]) if "http" in line else int(line.split()[1])
            return Child(proc, f"http://127.0.0.1:{port}")
    raise RuntimeError(f"{argv} exited before listening (rc={proc.wait()})")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Client:
    def __init__(self, prefill: str, decode: str, gateway: str) -> None:
        self.http = LoadClient()
        self.prefill, self.decode, self.gateway = prefill, decode, gateway
        # The decode engine collects the KV from the prefill engine's bootstrap port, as through
        # the gateway.
        self.bootstrap_port = httpx.get(prefill + "/get_server_info", trust_env=False).json()["bootstrap_port"]

    def _body(self, stream: bool) -> dict:
        return {"model": "default", "prompt": "hello there", "max_tokens": 4, "stream": stream}

    async def direct(self, stream: bool) -> float:
        body = {**self._body(stream), "bootstrap_host": "127.0.0.1", "bootstrap_port": self.bootstrap_port,
                "bootstrap_room": random.getrandbits(63)}
        prefill = asyncio.ensure_future(self.http.post(self.prefill + "/v1/completions", body))
        status, first = await self.http.post(self.decode + "/v1/completions", body)
        await prefill
        return _checked(status, first)

    async def via_gateway(self, stream: bool) -> float:
        return _checked(*await self.http.post(self.gateway + "/v1/completions", self._body(stream)))


def _checked(status: int, seconds: float) -> float:
    if status != 200:
        raise RuntimeError(f"benchmark request failed with {status}")
    return seconds


async def _paced(client: Client, rate: float, seconds: float, stream: bool):
    """Open loop at `rate` pairs/s: each tick sends one direct and one gateway call."""
    direct, gateway, tasks = [], [], []
    start = time.perf_counter()
    n = int(rate * seconds)

    async def pair(i: int) -> None:
        first, second = (client.direct, client.via_gateway) if i % 2 else (client.via_gateway, client.direct)
        a, b = await asyncio.gather(first(stream), second(stream))
        (direct if i % 2 else gateway).append(a)
        (gateway if i % 2 else direct).append(b)

    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(pair(i)))
    await asyncio.gather(*tasks)
    return direct, gateway


async def _saturate(client: Client, seconds: float, concurrency: int) -> tuple[int, float]:
    done = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            await client.via_gateway(False)
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done, time.perf_counter() - start


def _report(name: str, direct: list[float], gateway: list[float]) -> dict:
    row = {"mode": name, "requests": len(gateway)}
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        row[f"direct_{label}_ms"] = _pct(direct, q) * 1e3
        row[f"gateway_{label}_ms"] = _pct(gateway, q) * 1e3
        row[f"added_{label}_ms"] = (_pct(gateway, q) - _pct(direct, q)) * 1e3
    row["added_mean_ms"] = (statistics.fmean(gateway) - statistics.fmean(direct)) * 1e3
    return row


async def _run(args, prefill: Child, decode: Child, gateway: Child) -> list[dict]:
    client = Client(prefill.url, decode.url, gateway.url)
    rows = []
    try:
        for stream in (False, True):  # warm-up: connections, code paths
            await _paced(client, 50, 1.0, stream)
        for stream in (False, True):
            cpu0 = gateway.cpu_seconds()
            direct, via = await _paced(client, args.rate, args.seconds, stream)
            row = _report("streaming (first byte)" if stream else "non-streaming", direct, via)
            row["gateway_cpu_ms_per_request"] = (gateway.cpu_seconds() - cpu0) / len(via) * 1e3
            row["rate_per_s"] = args.rate
            rows.append(row)
        cpu0 = gateway.cpu_seconds()
        done, elapsed = await _saturate(client, args.seconds, args.concurrency)
        cpu = gateway.cpu_seconds() - cpu0
        rows.append({"mode": "saturation (non-streaming)", "requests": done,
                     "achieved_req_per_s": done / elapsed, "gateway_cpu_share": cpu / elapsed,
                     "one_core_req_per_s": done / cpu if cpu else float("nan")})
    finally:
        await client.http.aclose()
    return rows


def _routing_rate() -> dict:
    try:
        from laps_agent.gateway.routing import bench_routing
    except ImportError:
        return {"mode": "routing decisions", "note": "routing.bench_routing not available"}
    result = bench_routing()
    return {"mode": "routing decisions (in-process)", "decisions_per_s": float(result)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="laps bench gateway", description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=200.0, help="pairs of calls per second")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=16, help="for the saturation phase")
    p.add_argument("--json", action="store_true", help="print one JSON object per result")
    args = p.parse_args(argv)
    prefill = _spawn_engine("prefill")
    children = [prefill]
    try:
        decode = _spawn_engine("decode")
        children.append(decode)
        gateway = _spawn(["laps_agent.cli", "gateway", "--host", "127.0.0.1", "--port", "0",
                          "--prefill-short", prefill.url, "--prefill-long", prefill.url,
                          "--decode", decode.url, "--log-level", "warning"], "listening on")
        children.append(gateway)
        _wait_ready(gateway.url)
        rows = asyncio.run(_run(args, prefill, decode, gateway)) + [_routing_rate()]
    finally:
        for child in reversed(children):
            child.stop()
    for row in rows:
        if args.json:
            print(json.dumps(row))
        else:
            print(row.pop("mode") + ": " + ", ".join(
                f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    return 0


def _wait_ready(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", trust_env=False).json().get("ready"):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"gateway at {url} never became ready")


if __name__ == "__main__":
    sys.exit(main())
