"""Rows and the printed table of `laps bench gateway`, with the targets they are held to."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

# The gateway before engine-load polling and body splicing, as the issue measured it (added p50
# ms, gateway CPU ms per request), and the targets set against it: (KiB, clients) -> bounds.
BEFORE = {(1, 1): (0.71, 0.59), (40, 1): (3.35, 2.69), (40, 8): (30.2, None), (40, 32): (79.1, None)}
TARGETS = {(1, 1): (0.71, 0.59), (40, 1): (1.0, 1.0), (40, 8): (30.2 / 3, None),
           (40, 32): (79.1 / 3, None)}
SCALE_OUT_TARGET = 1.8


@dataclass
class Cell:
    kib: int                 # body size through the gateway
    clients: int
    stream: bool = False
    direct_kib: int | None = None   # control: direct calls of another size (None: the same)

    @property
    def name(self) -> str:
        name = f"{self.kib} KiB, {self.clients} client{'s' if self.clients > 1 else ''}"
        if self.stream:
            name += ", streaming (first byte)"
        if self.direct_kib is not None:
            name += f" (control: direct calls of {self.direct_kib} KiB)"
        return name


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_row(cell: Cell, direct: list[float], via: list[float], cpu_s: float) -> dict:
    row = {"mode": cell.name, "body_kib": cell.kib, "clients": cell.clients, "stream": cell.stream,
           "requests": len(via)}
    control = cell.direct_kib is not None  # direct and gateway calls differ: nothing "added"
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        row[f"direct_{label}_ms"] = _pct(direct, q) * 1e3
        row[f"gateway_{label}_ms"] = _pct(via, q) * 1e3
        row[f"added_{label}_ms"] = None if control else (_pct(via, q) - _pct(direct, q)) * 1e3
    row["added_mean_ms"] = None if control else (statistics.fmean(via) - statistics.fmean(direct)) * 1e3
    row["gateway_cpu_ms_per_request"] = cpu_s / len(via) * 1e3
    target = None if cell.stream or control else TARGETS.get((cell.kib, cell.clients))
    if target is not None:
        p50, cpu = target
        row["before_added_p50_ms"], row["target_added_p50_ms"] = BEFORE[cell.kib, cell.clients][0], p50
        met = row["added_p50_ms"] <= p50
        if cpu is not None:
            row["before_cpu_ms"], row["target_cpu_ms"] = BEFORE[cell.kib, cell.clients][1], cpu
            met = met and row["gateway_cpu_ms_per_request"] <= cpu
        row["target_met"] = met
    return row


def scale_out_ceiling(cores: int, gateway_cpu_ms: float, rest_cpu_ms: float) -> float:
    """The most two gateways can carry over one here (gateway.py's docstring): one runs at most
    1/X requests/s (one process, one core), two at most min(2/X, cores/(X+Y))."""
    x, y = gateway_cpu_ms, rest_cpu_ms
    one = min(1 / x, cores / (x + y))
    return min(2 / x, cores / (x + y)) / one


def scale_out_row(clients: int, cores: int, one: dict, two: dict) -> dict:
    ratio = two["req_per_s"] / one["req_per_s"]
    # X and Y from the two-gateway run (the gateways' costs there include sharing the machine).
    ceiling = scale_out_ceiling(cores, two["gateway_cpu_ms"], two["rest_cpu_ms"]) if cores else None
    return {"mode": f"scale-out (1 KiB, {clients} clients)", "cores": cores,
            "gateway_cpu_ms_per_request": two["gateway_cpu_ms"],
            "load_generator_and_upstreams_cpu_ms_per_request": two["rest_cpu_ms"],
            "ceiling_ratio_on_these_cores": ceiling,
            "one_gateway_req_per_s": one["req_per_s"], "two_gateways_req_per_s": two["req_per_s"],
            "ratio": ratio, "target_ratio": SCALE_OUT_TARGET, "target_met": ratio >= SCALE_OUT_TARGET,
            "one_gateway_cpu_share": one["cpu_share"], "two_gateways_cpu_share": two["cpu_share"],
            # Requests per second of gateway CPU: what one gateway core carries, whatever the
            # machine left to the gateways.
            "one_gateway_req_per_cpu_s": one["req_per_cpu_s"],
            "two_gateways_req_per_cpu_s": two["req_per_cpu_s"]}


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: list[dict]) -> str:
    """The human-readable report: one line per latency cell, then scale-out and routing."""
    head = (f"{'case':<52} {'n':>5} {'direct p50':>10} {'gw p50':>8} {'added p50':>9} "
            f"{'added p99':>9} {'gw CPU/req':>10} {'before p50/CPU':>15} {'target p50/CPU':>15}  met")
    lines = ["latency in ms; added = via the gateway minus direct, same run", head, "-" * len(head)]
    for r in rows:
        if "gateway_p50_ms" in r:
            before = (f"{_fmt(r.get('before_added_p50_ms'))}/{_fmt(r.get('before_cpu_ms'))}"
                      if "before_added_p50_ms" in r else "")
            target = (f"{_fmt(r.get('target_added_p50_ms'))}/{_fmt(r.get('target_cpu_ms'))}"
                      if "target_added_p50_ms" in r else "")
            met = {True: "yes", False: "NO"}.get(r.get("target_met"), "")
            lines.append(f"{r['mode']:<52} {r['requests']:>5} {r['direct_p50_ms']:>10.2f} "
                         f"{r['gateway_p50_ms']:>8.2f} {_fmt(r['added_p50_ms']):>9} {_fmt(r['added_p99_ms']):>9} "
                         f"{r['gateway_cpu_ms_per_request']:>10.3f} {before:>15} {target:>15}  {met}")
        elif "ratio" in r:
            lines.append(
                f"\n{r['mode']} on {r['cores']} cores: one gateway {r['one_gateway_req_per_s']:.0f} req/s "
                f"(gateway CPU {r['one_gateway_cpu_share']:.2f} cores), two gateways "
                f"{r['two_gateways_req_per_s']:.0f} req/s ({r['two_gateways_cpu_share']:.2f} cores): "
                f"x{r['ratio']:.2f}, target x{r['target_ratio']:.1f} "
                f"{'met' if r['target_met'] else 'NOT met'}; requests per gateway CPU-second: "
                f"{r['one_gateway_req_per_cpu_s']:.0f} (one), {r['two_gateways_req_per_cpu_s']:.0f} (two)"
                f"\n  CPU per request: gateway {r['gateway_cpu_ms_per_request']:.3f} ms, load generator + "
                f"stub upstreams {r['load_generator_and_upstreams_cpu_ms_per_request']:.3f} ms: the most two "
                f"gateways can show on {r['cores']} cores is x{_fmt(r['ceiling_ratio_on_these_cores'])}")
        elif "decisions_per_s" in r:
            lines.append(f"{r['mode']}: {r['decisions_per_s']:,.0f}/s")
    return "\n".join(lines)
