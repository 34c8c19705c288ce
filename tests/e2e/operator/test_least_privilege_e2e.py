"""Least privilege, proven against an API server that enforces RBAC (the emulator; see
least_privilege.py for the story and what the emulator cannot show):

* the whole operator story passes with the chart's ServiceAccount, in both chart modes, and the
  gateway discovers engines with the ServiceAccount the operator made for it;
* the permissions are derived, not hand-listed: what each program was granted equals what it
  used (recorded by the emulator, including the checks RBAC escalation prevention and the
  owner-reference admission plugin make on its behalf): nothing missing, nothing extra;
* every single rule of the chart is needed: without it, a named step of the story gets a 403.
"""
from __future__ import annotations

import pytest

from tests.e2e.operator.least_privilege import (
    GATEWAY_USER,
    MODES,
    NS,
    OPERATOR_USER,
    StepDenied,
    Story,
    chart_operator_rules,
    rule_label,
    triples,
)
from tests.support.kube_emulator_rbac import expand_rules

STEPS = ["start", "create", "pods", "gateway", "scale_up", "relabel", "repair", "prune", "delete"]
CLUSTER_RULES = chart_operator_rules("all-namespaces")


def _table(title: str, rows: set) -> str:
    return "\n".join([title, *(f"  {g or 'core'} {r} {v}" for g, r, v in sorted(rows))])


@pytest.mark.parametrize("mode", list(MODES))
def test_the_operator_story_runs_under_the_charts_service_account_with_exactly_its_rules(
        kube_api, start_operator, gateway_process, monkeypatch, mode):
    story = Story(kube_api, start_operator, gateway_process, monkeypatch, mode=mode)
    story.install()
    story.run()      # any 403 to the operator or the gateway fails here, naming the step
    assert story.steps_done == STEPS

    granted, used = triples(chart_operator_rules(mode)), story.used(OPERATOR_USER)
    print(_table(f"operator ({mode}) used:", used))
    assert not used - granted, _table("used but not granted by the chart:", used - granted)
    assert not granted - used, _table("granted by the chart but never used:", granted - used)

    # The gateway: the Role the operator builds for it, against what it asked for.
    assert story.used(GATEWAY_USER) == _gateway_role_triples()


def _gateway_role_triples() -> set:
    from laps_operator.naming import ClusterRef
    from laps_operator.render.builders import build_gateway_rbac
    from laps_operator.spec.cluster import parse_spec

    _, role, _ = build_gateway_rbac(ClusterRef("smollm2", NS, "uid"), parse_spec({"model": {"name": "m", "path": "/m"}}))
    return {(a.group, a.full_resource, a.verb) for a in expand_rules(role["rules"], NS)}


@pytest.mark.parametrize("index", range(len(CLUSTER_RULES)), ids=[rule_label(r) for r in CLUSTER_RULES])
def test_without_any_one_chart_rule_a_named_step_is_refused(kube_api, start_operator, gateway_process,
                                                            monkeypatch, index):
    removed = CLUSTER_RULES[index]
    story = Story(kube_api, start_operator, gateway_process, monkeypatch)
    story.install(edit_rules=lambda rules: [r for r in rules if r != removed])
    with pytest.raises(StepDenied) as denied:
        story.run()
    refused = denied.value
    print(f"without {rule_label(removed)}: step {refused.step!r} refused: {refused.attrs.describe()}")
    assert refused.step in STEPS
    assert (refused.attrs.group, refused.attrs.full_resource, refused.attrs.verb) in triples([removed])
