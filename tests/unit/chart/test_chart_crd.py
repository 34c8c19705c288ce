"""The fingerprint the chart's CRD check compares (templates/crd-check.yaml): the CRD file carries
the sha256 of its own spec, so the check can tell an older CRD in the cluster from this one
without comparing schemas the API server normalises. The upgrade itself is exercised against the
emulated API server in tests/e2e/operator/test_helm_upgrade_e2e.py. The file is generated
(laps_operator.spec.crd; tests/unit/operator/test_crd_generated.py) and the chart's is the only one."""
from __future__ import annotations

import hashlib
import json

import yaml

from laps_operator.spec.crd import REGENERATE
from tests.unit.chart.test_chart import CHART, ROOT

KEY = "laps.io/spec-sha256"


def spec_sha256(crd: dict) -> str:
    return hashlib.sha256(json.dumps(crd["spec"], sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_the_crd_carries_the_sha256_of_its_spec():
    # Stale, the check would pass an older CRD in the cluster (one of the same stale value), or
    # refuse this very file after it was applied. The generator sets it: regenerate after an edit.
    crd = yaml.safe_load((CHART / "crds" / "lapscluster.yaml").read_text())
    want = spec_sha256(crd)
    assert crd["metadata"]["annotations"][KEY] == want, (
        f"metadata.annotations[{KEY}] of charts/laps/crds/lapscluster.yaml should be {want}: "
        f"regenerate the file ({REGENERATE}) rather than edit it")


def test_the_chart_holds_the_one_crd_file_of_the_repository():
    # One fact, one place: the chart ships the CRD; no second copy (the old crds/) can drift from it.
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == ["lapscluster.yaml"]
    assert not (ROOT / "crds").exists(), "crds/ again: charts/laps/crds/lapscluster.yaml is the CRD's one file"
