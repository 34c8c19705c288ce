from __future__ import annotations

import pytest

from laps_operator import metrics


@pytest.fixture
def cluster_metrics():
    """The operator's series of cluster ns/c (uid-1), opened as the operator opens them when it
    first sees the cluster, and forgotten after the test: the registry is the process's, and a
    series left behind showed up in a later test's Prometheus scrape on the same worker."""
    metrics.start_cluster("ns", "c", "uid-1")
    yield
    metrics.forget_cluster("ns", "c")
