"""The fingerprint the chart's CRD check compares (templates/crd-check.yaml): the CRD file carries
the sha256 of its own spec, so the check can tell an older CRD in the cluster from this one
without comparing schemas the API server normalises. The upgrade itself is exercised against the
emulated API server in tests/e2e/operator/test_helm_upgrade_e2e.py."""
from __future__ import annotations

import hashlib
import json

import yaml

from tests.unit.chart.test_chart import CHART

KEY = "laps.io/spec-sha256"


def spec_sha256(crd: dict) -> str:
    return hashlib.sha256(json.dumps(crd["spec"], sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_the_crd_carries_the_sha256_of_its_spec():
    # Stale, the check would pass an older CRD in the cluster (one of the same stale value), or
    # refuse this very file after it was applied. After editing the CRD, set the value printed.
    crd = yaml.safe_load((CHART / "crds" / "lapscluster.yaml").read_text())
    want = spec_sha256(crd)
    assert crd["metadata"]["annotations"][KEY] == want, (
        f"set metadata.annotations[{KEY}] to {want} in crds/lapscluster.yaml and "
        "charts/laps/crds/lapscluster.yaml")

