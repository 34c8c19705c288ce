"""Stand-ins for what the planner reads through Prometheus: a gateway pod's demand counters,
growing at rates the test sets, and an engine pod's series (tests/e2e/operator/test_planner_e2e.py,
tests/cluster/test_planner.py). The real gateway's counting is tested with the gateway."""
from __future__ import annotations

import threading
import time

from tests.support.get_server import GetServer

PREFILL_COST = 'laps_engine_prefill_cost_seconds{term="overhead"} 0.017\nlaps_engine_prefill_cost_seconds{term="per_token"} 0.0001\n'


class Demand:
    """A gateway's /metrics whose arrival counters grow at the rates the test sets (per class:
    requests/s, prompt tokens each, answer tokens each)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = {(c, k): 0.0 for c in ("short", "long") for k in ("requests", "prompt", "output")}
        self._rates = {key: 0.0 for key in self._totals}
        self._at = time.monotonic()
        self.http = GetServer(self._metrics)

    def _advance(self) -> None:
        now = time.monotonic()
        for key, rate in self._rates.items():
            self._totals[key] += rate * (now - self._at)
        self._at = now

    def set(self, cls: str, rate: float, prompt: int, output: int) -> None:
        with self._lock:
            self._advance()
            self._rates.update({(cls, "requests"): rate, (cls, "prompt"): rate * prompt, (cls, "output"): rate * output})

    def _metrics(self) -> tuple[str, bytes]:
        with self._lock:
            self._advance()
            lines = [f'laps_gateway_arrivals_total{{class="{c}"}} {self._totals[c, "requests"]}' for c in ("short", "long")]
            lines += [f'laps_gateway_arrival_tokens_total{{class="{c}",kind="{k}"}} {self._totals[c, k]}'
                      for c in ("short", "long") for k in ("prompt", "output")]
            lines += [f'laps_gateway_pending_requests{{group="{g}"}} 0' for g in ("short", "long")]
        return "text/plain; version=0.0.4", ("\n".join(lines) + "\n").encode()


def engine_metrics(text: str) -> GetServer:
    """An engine pod's /metrics answering `text`."""
    return GetServer(lambda: ("text/plain; version=0.0.4", text.encode()))
