"""The service level every component reads the same way: the TTFT SLO per length class and the
ITL SLO, stated at one quantile (spec.slo, the `--slo` and `--itl-slo` flags), and their defaults.
The gateway admits and places by them, the engines order decode admission by them
(scheduling/decode_order.py), the planner sizes pools for them, `laps sim` and `laps bench`
count attainment against them."""
from __future__ import annotations

from collections.abc import Mapping

from laps_agent.policy.classes import CLASSES, LONG, SHORT

# The quantile the SLOs are stated at (spec.slo: TTFT p90, ITL p90), and their defaults.
SLO_QUANTILE = 0.9
DEFAULT_TTFT_SLO_S = {SHORT: 0.5, LONG: 3.0}
DEFAULT_ITL_SLO_S = 0.05


def ttft_slos(given: Mapping[str, float] | None = None) -> dict[str, float]:
    """Each class's TTFT SLO from `short=`, `long=` and `all=` values (--slo): a class without
    its own takes `all`, then the default."""
    given = given or {}
    return {c: float(given.get(c, given.get("all", DEFAULT_TTFT_SLO_S[c]))) for c in CLASSES}
