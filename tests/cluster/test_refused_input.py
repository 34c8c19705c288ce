"""Bad input against the real API server: every invalid LAPSCluster the suite has (the unit tier's
samples, tests/unit/operator/test_crd.py) is refused by the CRD's schema and CEL rules as a user
meets it, in `kubectl apply`'s own words, naming the field; the same documents made valid apply."""
from __future__ import annotations

import json

import pytest

from laps_operator.naming import CRD_NAME
from tests.unit.operator.test_crd import CROSS_FIELD, INVALID, MINIMAL, NAMES, with_spec

CRD = "charts/laps/crds/lapscluster.yaml"


@pytest.fixture
def kubectl_apply(control_plane, cluster_namespace):
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", CRD)
    control_plane.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}")

    def apply(doc: dict):
        return control_plane.kubectl("apply", "--dry-run=server", "-n", cluster_namespace, "-f", "-",
                                     stdin=json.dumps(doc), check=False)
    return apply


def _field(where: str) -> str:
    """The field as the API server names it: list indexes in brackets (`tolerations[0]`)."""
    parts = where.split(".")
    out = parts[0]
    for part in parts[1:]:
        out += f"[{part}]" if part.isdigit() else f".{part}"
    return out


@pytest.mark.parametrize(("doc", "where", "says"), INVALID, ids=[w + ":" + s for _, w, s in INVALID])
def test_an_invalid_cr_is_refused_naming_the_field(kubectl_apply, doc, where, says):
    result = kubectl_apply(doc)
    print(result.stderr)
    assert result.returncode != 0
    assert 'The LAPSCluster "c" is invalid' in result.stderr or "unknown field" in result.stderr, result.stderr
    field = _field(where).replace(".nvidia.com/gpu", "[nvidia.com/gpu]")
    assert field in result.stderr or where in result.stderr, result.stderr


@pytest.mark.parametrize(("changes", "message"), CROSS_FIELD, ids=[m[:60] for _, m in CROSS_FIELD])
def test_a_cross_field_rule_is_refused_with_its_message(kubectl_apply, changes, message):
    result = kubectl_apply({**MINIMAL, "spec": {**MINIMAL["spec"], **changes}})
    print(result.stderr)
    assert result.returncode != 0 and message in result.stderr, result.stderr


@pytest.mark.parametrize(("name", "fits"), NAMES, ids=[f"{n[:12]}..{len(n)}" for n, _ in NAMES])
def test_a_name_too_long_for_the_childrens_names_is_refused(kubectl_apply, name, fits):
    result = kubectl_apply({**MINIMAL, "metadata": {"name": name}})
    print(result.stderr)
    assert (result.returncode == 0) is fits, result.stderr
    if not fits:
        assert "metadata.name" in result.stderr, result.stderr


def test_the_minimal_and_a_changed_valid_cr_apply(kubectl_apply):
    for doc in (MINIMAL, with_spec(**{"prefill.replicas": 6, "laps.lengthThreshold": 512})):
        result = kubectl_apply(doc)
        assert result.returncode == 0, result.stderr
