"""Benchmark: the real SGLang prefill server with the LAPS plugin on vs off (CPU; CPU figures
are not GPU figures). Run: `.venv/bin/python -m tests.sglang.bench_sglang` (needs
scripts/setup_sglang.sh). Per mode it starts a prefill server (decode and gateway shared), then

1. the `laps bench engine` scenario over real PD: one long prompt (2048 tokens) arriving with 8
   short ones (32-100 tokens), each producing one token, so its latency is its TTFT; and
2. `laps bench run` on tests/sglang/bench_workload.yaml through this project's gateway,

and prints short and long TTFT side by side.
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.sglang.burst import Sender, prompt
from tests.sglang.servers import REPO, SGLangServer, setup_problem
from tests.support.waiting import poll


def _gateway(prefill: SGLangServer, decode: SGLangServer):
    from laps_agent.gateway.config import GatewayConfig
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec
    from laps_agent.gateway.estimate import TokenEstimator
    from laps_agent.gateway.http.app import create_app
    from laps_agent.serving.listen import ServerThread

    discovery = StaticDiscovery(StaticSpec((prefill.url,), (prefill.url,), (decode.url,)), poll_s=0.2)
    server = ServerThread(create_app(GatewayConfig(served_model_name="smollm2", request_deadline_s=600.0),
                                     discovery, TokenEstimator(None))).start()
    poll(lambda: discovery.membership().decode and all(discovery.membership().groups.values()), timeout=60)
    return server


def burst(url: str, repeats: int) -> dict[str, list[float]]:
    """1 long (~2048 tokens) + 8 short (~32-100 tokens) sent together; client latency with
    max_tokens=1 is the TTFT through the whole PD path."""
    ttft: dict[str, list[float]] = {"short": [], "long": []}
    for r in range(repeats):
        sender = Sender(url)
        start = time.monotonic()
        sender.send("long", prompt(1380, seed=1000 + r))  # ~2048 tokens of these words
        for i in range(8):
            sender.send(f"s{i}", prompt(22 + 8 * i, seed=2000 + 10 * r + i))  # ~32-100 tokens
        done = sender.join()
        for name, (at, _) in done.items():
            ttft["long" if name == "long" else "short"].append(at - start)
    return ttft


def bench_run(url: str, out: Path, label: str) -> str:
    cmd = [str(REPO / ".venv/bin/laps"), "bench", "run", url, "--workload",
           str(Path(__file__).with_name("bench_workload.yaml")), "--tokenizer", str(REPO / ".cache/smollm2-hf"),
           "--out", str(out / label), "--label", label, "--no-progress", "--model", "smollm2"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900).stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-run", action="store_true", help="only the burst")
    args = p.parse_args()
    if problem := setup_problem():
        print(problem, file=sys.stderr)
        return 2
    logs = Path(tempfile.mkdtemp(prefix="sglang-bench-"))
    decode = SGLangServer("decode", logs).wait_ready()
    results, runs = {}, {}
    try:
        for mode, env in (("plugin on", {"LAPS_SCHEDULER": "1"}), ("plugin off", {})):
            prefill = SGLangServer("prefill", logs, env=env).wait_ready()
            gateway = _gateway(prefill, decode)
            try:
                warm = Sender(gateway.url)  # one-off first-request costs stay out of the figures
                warm.send("warm", prompt(8, seed=0))
                warm.join()
                results[mode] = burst(gateway.url, args.repeats)
                if not args.skip_run:
                    runs[mode] = bench_run(gateway.url, logs, mode.replace(" ", "-"))
            finally:
                gateway.stop()
                prefill.stop()
    finally:
        decode.stop()
    print("\n## burst: 1 long (~2048 tokens) + 8 short (~32-100), arriving together; TTFT seconds "
          f"(mean over {args.repeats} repeats; CPU, SmolLM2-135M, real SGLang 0.5.23 PD)\n")
    print("| mode | short mean | short p50 | short max | long mean |")
    print("|---|---|---|---|---|")
    for mode, t in results.items():
        s = t["short"]
        print(f"| {mode} | {statistics.mean(s):.2f} | {statistics.median(s):.2f} | {max(s):.2f} | "
              f"{statistics.mean(t['long']):.2f} |")
    for mode, text in runs.items():
        print(f"\n## laps bench run (tests/sglang/bench_workload.yaml), {mode}\n")
        print(re.sub(r"\n{3,}", "\n\n", text.strip()))
    print(f"\n(server logs and results: {logs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
