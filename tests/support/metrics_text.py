"""Reading one sample off a Prometheus /metrics page, for tests: strict by default, so a typo in a
series name fails instead of reading as 0."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

_MISSING = object()


def metric_value(text: str, name: str, default: float | object = _MISSING, **labels: str) -> float:
    """The value of sample `name{labels}`; `default` when given and the series is absent (e.g. a
    histogram child that has seen no observation yet)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    if default is not _MISSING:
        return float(default)
    raise AssertionError(f"no series {name}{labels} on the page")
