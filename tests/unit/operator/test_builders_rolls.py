"""Which pods an edit rolls (docs/kubernetes.md, "After an edit"): the pods whose template it changes, and
no others; the operator's own knobs restart nothing."""
from __future__ import annotations

import json

import pytest

from laps_operator.naming import ClusterRef
from laps_operator.render.builders import build_children
from laps_operator.spec.cluster import parse_spec

CLUSTER = ClusterRef("demo", "serving", "0b7c-uid")
BASE = {"model": {"name": "SmolLM2", "path": "/models/smol.gguf", "servedName": "smol"}, "prefill": {"replicas": 4}}


def spec_of(**overrides):
    return parse_spec({**BASE, **overrides})


def _templates(spec) -> dict[str, dict]:
    return {m["metadata"]["name"]: m["spec"]["template"] for m in build_children(CLUSTER, spec)
            if m["kind"] in ("StatefulSet", "Deployment")}


ROLLS = [
    # Knobs of the operator alone: a change must restart no pod (docs/kubernetes.md says so).
    ({"laps": {"allocation": {"enabled": True, "intervalSeconds": 9, "ratio": 3, "minPerGroup": 2,
                              "cooldownSeconds": 1, "confirmIntervals": 5}}}, set()),
    ({"monitoring": {"prometheusURL": "http://prom:9090", "podMonitor": True, "pressureQuery": "q"}}, set()),
    ({"networkPolicy": {"enabled": False}}, set()),
    ({"prefill": {"replicas": 6}, "decode": {"replicas": 3}, "gateway": {"replicas": 2}}, set()),
    # What engines and gateway must agree on rolls all three; the prefill scheduler its pods only.
    ({"laps": {"lengthThreshold": 512}}, {"demo-prefill", "demo-decode", "demo-gateway"}),
    ({"laps": {"scheduler": {"waitWindowMs": 9}}}, {"demo-prefill"}),
    ({"laps": {"batchPrefillGraphs": {"seqLengths": [32, 64]}}}, {"demo-prefill"}),
    ({"gateway": {"requestDeadlineSeconds": 5}}, {"demo-gateway"}),
    # The gateway Service's annotations are the Service's alone; pod metadata and scheduling are
    # their role's template.
    ({"gateway": {"serviceType": "LoadBalancer", "serviceAnnotations": {"example.com/lb": "internal"}}}, set()),
    ({"prefill": {"podAnnotations": {"sidecar.istio.io/inject": "false"}}}, {"demo-prefill"}),
    ({"decode": {"podLabels": {"team": "ml"}, "priorityClassName": "gpu"}}, {"demo-decode"}),
    ({"gateway": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                 "whenUnsatisfiable": "ScheduleAnyway"}]}}, {"demo-gateway"}),
]


@pytest.mark.parametrize(("edit", "rolled"), ROLLS, ids=[json.dumps(e) for e, _ in ROLLS])
def test_an_edit_rolls_the_pods_whose_template_it_changes_and_no_others(edit, rolled):
    before, after = _templates(spec_of()), _templates(spec_of(**edit))
    assert {name for name in before if before[name] != after[name]} == rolled
