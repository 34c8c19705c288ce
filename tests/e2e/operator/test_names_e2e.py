"""A LAPSCluster whose name its children cannot carry. The CRD's schema refuses such names
(metadata.name: at most 44 characters, a DNS-1035 label); the emulator, like a server with an
older CRD, stores them, and the operator answers with the InvalidSpec condition instead of
children that a real API server would refuse one write at a time (and retry forever)."""
from __future__ import annotations

import pytest

from tests.e2e.operator.conftest import wait_for
from tests.e2e.operator.test_operator_e2e import NS, Cluster, example


@pytest.mark.parametrize(("name", "says"), [("serving.smollm2", "DNS-1035"), ("s" * 45, "at most 44")],
                         ids=["dotted", "45-characters"])
def test_a_name_the_children_cannot_carry_gets_invalid_spec_and_no_children(kube_api, start_operator, name, says):
    start_operator()
    cluster = Cluster(kube_api, name)
    cluster.create(example(name))
    invalid = wait_for(lambda: cluster.condition("InvalidSpec"), "the InvalidSpec condition")
    assert invalid["status"] == "True" and invalid["message"].startswith("metadata.name:") and says in invalid["message"]
    assert cluster.status()["phase"] == "Invalid"
    wait_for(lambda: any(r == "InvalidSpec" for r, _ in cluster.events()), "an InvalidSpec event")
    assert not cluster.apps.list_namespaced_stateful_set(NS).items
    assert not cluster.apps.list_namespaced_deployment(NS).items
    assert not cluster.core.list_namespaced_config_map(NS, label_selector="app.kubernetes.io/managed-by=laps-operator").items
